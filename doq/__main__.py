import sys

from doq.cli import main

sys.exit(main())
