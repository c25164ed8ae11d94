"""The chat library: chats, their version tree, search, and the chat file format.

It owns the app's database (sessions, checkpoints and the chats' own tables) and
knows nothing of HTTP: the web app (`webapp.web`), the `import` command and the
benchmarks all use it the same way.
"""
