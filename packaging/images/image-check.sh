#!/bin/bash
# image-check.sh: `make image-check` (as root, after `make image`): image_check.py with the project's venv.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
exec "${PYTHON:-$REPO/.venv/bin/python}" "$HERE/image_check.py" "$@"
