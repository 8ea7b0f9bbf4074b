import sys

from flare.cli import main

sys.exit(main())
