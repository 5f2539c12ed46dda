import sys

from nexttok.cli import entry

sys.exit(entry())
