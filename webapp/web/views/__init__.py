"""One module per page family: chats (list, page, rename, delete) and messages (the flows)."""
