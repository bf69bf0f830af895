"""Runs a command as a child, passes SIGINT/SIGTERM on to it, and writes its exit status to DIR/rank<R>.

Usage: python exit_recorder.py DIR COMMAND...

horovodrun 0.28.1 cannot be trusted with a rank's exit status after a signal: each rank's middleman
waits for the rank's shell in its main thread (``Popen.wait``) while its terminate thread reaps the
same shell (``psutil.Process.wait``). When the terminate thread wins, ``Popen.wait`` gets ECHILD and
reports 0, so horovodrun prints no "exit with status code" line and exits 0 although the rank exited
143 (seen once in CI). Tests of the ranks' own exit status read what this wrapper records instead.
"""

import os
import signal
import subprocess
import sys


def main() -> int:
    directory, command = sys.argv[1], sys.argv[2:]
    child = subprocess.Popen(command)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda received, frame: child.send_signal(received))
    code = child.wait()
    code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    rank = os.environ.get("HOROVOD_RANK", "0")
    with open(os.path.join(directory, f"rank{rank}"), "w", encoding="utf-8") as record:
        record.write(f"{code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
