import sys

from cortex.cli import main

sys.exit(main())
