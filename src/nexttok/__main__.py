import sys

from nexttok.cli import main

sys.exit(main())
