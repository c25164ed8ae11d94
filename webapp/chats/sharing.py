"""SPEC §15's tables as one schema step (share links, projects and their files), and the
stores over them that `webapp.chats.store.ChatStore` holds."""

from __future__ import annotations

from webapp.chats import projects, share_rows
from webapp.chats.project_files import ProjectFiles
from webapp.chats.projects import Projects
from webapp.chats.shares import Shares

__all__ = ["POSTGRES_SCHEMA", "SCHEMA", "ProjectFiles", "Projects", "Shares"]

SCHEMA = share_rows.SCHEMA + projects.SCHEMA
POSTGRES_SCHEMA = share_rows.POSTGRES_SCHEMA + projects.POSTGRES_SCHEMA
