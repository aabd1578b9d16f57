import sys

from doq.chaos.runner import main

sys.exit(main())
