"""`pofe.files`: a file written to a full disk is named, and leaves nothing half-written (issue 45)."""

from __future__ import annotations

import json
import subprocess
import sys

# writes a 64 KiB JSON Lines file with POFE's writer into the folder argv[1], and prints what it raised
WRITE = """
import json, os, sys
from pathlib import Path
from pofe.files import write_jsonl_atomic
folder = Path(sys.argv[1])
try:
    write_jsonl_atomic(folder / "rows.jsonl", [{"text": "x" * 1000}] * 64)
    out = {"raised": None}
except OSError as e:
    out = {"raised": str(e), "errno": e.errno}
out["left"] = sorted(os.listdir(folder))
print(json.dumps(out))
"""


def test_a_file_written_to_a_full_disk_is_named_and_nothing_of_it_is_left(tmp_path):
    """A real full disk: a 16 KiB tmpfs mounted in a mount namespace of the test's own
    (`unshare -rm`), 64 KiB written to it. The error names the file, the system's reason and
    errno 28 (ENOSPC), and no temporary file is left (it was `rows.jsonl.tmp-<pid>`, and the bare
    OSError named no file)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = 'mount -t tmpfs -o size=16k tmpfs "$1" && exec "$2" -c "$3" "$1"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount, "sh", str(disk), sys.executable, WRITE],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(proc.stdout)
    assert out == {
        "raised": f"could not write {disk / 'rows.jsonl'}: No space left on device (errno 28). Nothing of it was "
        f"left half-written. Free space on the disk holding {disk} (or make it writable), then run again.",
        "errno": 28,
        "left": [],
    }
