"""A bound mount with hard links and special files made in it keeps working: the store keeps
them through materialize and a restart (what materialize writes of them is the reconciler's
business, issue 12 item 5); nothing fails with EIO and the daemon's log shows no error."""

from __future__ import annotations

import os
import socket
import stat


def test_links_and_special_files_in_a_bound_mount_do_not_break_it(backed):  # noqa: F811
    m, disk = backed
    w = m.work
    (w / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (w / "linked").mkdir()
    os.link(w / "tool.sh", w / "linked" / "tool-again.sh")
    os.mkfifo(w / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(w / "agent.sock"))
    sock.close()
    m.cli("materialize", check=False)
    m.cli("sync", check=False)
    assert os.lstat(w / "tool.sh").st_ino == os.lstat(w / "linked" / "tool-again.sh").st_ino
    assert os.lstat(w / "tool.sh").st_nlink == 2
    assert stat.S_ISFIFO(os.lstat(w / "pipe").st_mode)
    assert stat.S_ISSOCK(os.lstat(w / "agent.sock").st_mode)
    m.remount()
    assert os.lstat(w / "linked" / "tool-again.sh").st_nlink == 2
    assert (w / "linked" / "tool-again.sh").read_text() == "#!/bin/sh\necho tool\n"
    assert stat.S_ISFIFO(os.lstat(w / "pipe").st_mode)
    os.unlink(w / "tool.sh")
    assert os.lstat(w / "linked" / "tool-again.sh").st_nlink == 1
    sorted(os.listdir(w))  # still answers
    log = m.log_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
