import sys

from samu.bench.cli import main

sys.exit(main())
