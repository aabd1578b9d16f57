import sys

from tools.chaos.runner import main

sys.exit(main())
