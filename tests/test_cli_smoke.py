import subprocess
import sys


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "memfs", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "memfs" in out.stdout
