"""`python -m nxd_train` (and `torchrun ... -m nxd_train`) is the nxd-train command."""

import sys

from nxd_train.command import main

sys.exit(main())
