"""What `mf launch` runs on every rank (through mf_parallel's rank entry): `mf train ARGS...`.

Kept alone in its directory: the rank entry puts a script's directory first on sys.path, as
`python SCRIPT` would, and nothing here may shadow a real module.
"""

import sys

from mf_cli.main import main

sys.exit(main(["train", *sys.argv[1:]]))
