"""Forks many sleeping children and one setsid grandchild; returns their pids."""
import os
import time


class P:
    def do_filter(self, hosts, vm, args):
        pids = []
        for _ in range(args.get("children", 300)):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(600)
                os._exit(0)
            pids.append(pid)
        r, w = os.pipe()
        if os.fork() == 0:  # a child that starts a new session, forks a daemon and exits
            os.close(r)
            os.setsid()
            daemon = os.fork()
            if daemon == 0:
                time.sleep(600)
                os._exit(0)
            os.write(w, str(daemon).encode())
            os._exit(0)
        os.close(w)
        daemon = int(os.read(r, 32))
        for pid in list(pids[:5]):
            os.kill(pid, 9)  # some die early: zombies unless reaped
        time.sleep(0.2)
        return {"children": pids, "daemon": daemon}
