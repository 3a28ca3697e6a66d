"""Entry point of a sampler worker process: ``python -m training.serve._worker_main CONFIG_JSON``.

A module of its own, which the package does not import: ``python -m`` on a module the
package already imported would run it twice.
"""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":
    from training.serve.workers import serve_worker

    sys.exit(serve_worker(json.loads(sys.argv[1])))
