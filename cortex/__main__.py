import multiprocessing
import sys

from cortex.cli import main

# the one-file executable: a tokenize pool process (spawned: the executable again) runs its
# job here instead of the command line; a no-op otherwise
multiprocessing.freeze_support()
sys.exit(main())
