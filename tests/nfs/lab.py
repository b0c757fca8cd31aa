#!/usr/bin/python3
"""Helper for tests/nfs/lab.sh (stdlib only; runs on the host AND inside the guests).

Roles:
  supervise RUNDIR          host: child subreaper that owns every process the lab starts
                            (ganesha, rpcbind, qemu, qemu's guestfwd forwarders) and reaps them.
  spawn RUNDIR NAME LOG -- ARGV...
                            host: ask the supervisor to start ARGV; writes RUNDIR/NAME.pid
  shutdown RUNDIR           host: supervisor kills everything it owns, reaps it, exits.
  serve PORT                guest: PID 1 command listener.
  exec PORT CMD             host: run CMD (sh -c) in the guest, stream stdout/stderr, exit with
                            its status (128+N when killed by signal N; 255 on channel failure).
  wait NAME PORT PIDFILE CONSOLE TIMEOUT
                            host: wait until the guest answers (and set its clock); fail with the
                            console tail when the VM dies or the timeout passes.
  freeport                  host: print a free TCP port on 127.0.0.1.
  waitport PORT TIMEOUT PIDFILE   host: wait for 127.0.0.1:PORT to accept while PIDFILE's pid lives.

  clock PORT                host: print the guest's clock offset to the host and the round trip.

Wire protocol of serve/exec: client sends one JSON line {"cmd":...} (or {"op":"clock"} /
{"op":"adjust","delta":seconds}); server answers frames: 1 byte kind (o=stdout e=stderr x=exit) + 4 byte
big-endian length + payload. Closing the connection kills the command's process group.
"""
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time


def die(msg, code=2):
    sys.stderr.write("lab.py: %s\n" % msg)
    sys.exit(code)


def pid_alive(pid):
    """True when pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return False
    state = st[st.rindex(")") + 2:].split()[0]
    return state not in ("Z", "X")


# ----------------------------------------------------------------------------- supervisor
def supervise(rundir):
    import ctypes
    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        die("prctl(PR_SET_CHILD_SUBREAPER) failed")
    sock_path = os.path.join(rundir, "supervisor.sock")
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    names = {}  # pid -> name

    def log(msg):
        sys.stdout.write("%s supervisor: %s\n" % (time.strftime("%H:%M:%S"), msg))
        sys.stdout.flush()

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if os.WIFSIGNALED(status):
                how = "killed by signal %d" % os.WTERMSIG(status)
            else:
                how = "exited with status %d" % os.WEXITSTATUS(status)
            log("%s (pid %d) %s" % (names.pop(pid, "orphan"), pid, how))

    def children():
        me = os.getpid()
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d) as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rindex(")") + 2:].split()
            if int(rest[1]) == me:
                out.append(int(d))
        return out

    def shutdown():
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            kids = children()
            if not kids:
                break
            for pid in kids:
                log("sending signal %d to %s (pid %d)" % (sig, names.get(pid, "orphan"), pid))
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while time.time() < deadline:
                reap()
                if not any(pid_alive(p) for p in children()):
                    break
                time.sleep(0.05)
        reap()

    log("started pid %d" % os.getpid())
    signal.signal(signal.SIGTERM, lambda *a: (shutdown(), os._exit(0)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        reap()
        r, _, _ = select.select([srv], [], [], 0.2)
        if not r:
            continue
        conn, _ = srv.accept()
        try:
            conn.settimeout(10)
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            req = json.loads(data.decode())
            if req["op"] == "spawn":
                env = dict(req.get("env") or os.environ)
                logf = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                nullf = os.open("/dev/null", os.O_RDONLY)
                pid = os.fork()
                if pid == 0:
                    try:
                        os.setsid()
                        os.dup2(nullf, 0)
                        os.dup2(logf, 1)
                        os.dup2(logf, 2)
                        signal.signal(signal.SIGINT, signal.SIG_DFL)
                        signal.signal(signal.SIGHUP, signal.SIG_DFL)
                        signal.signal(signal.SIGTERM, signal.SIG_DFL)
                        os.execvpe(req["argv"][0], req["argv"], env)
                    except BaseException as e:  # noqa
                        os.write(2, ("exec failed: %s\n" % e).encode())
                    os._exit(127)
                os.close(logf)
                os.close(nullf)
                names[pid] = req["name"]
                with open(os.path.join(rundir, req["name"] + ".pid"), "w") as f:
                    f.write("%d\n" % pid)
                log("started %s (pid %d): %s" % (req["name"], pid, " ".join(req["argv"])))
                conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
            elif req["op"] == "shutdown":
                shutdown()
                conn.sendall(b'{"ok": true}\n')
                conn.close()
                srv.close()
                os.unlink(sock_path)
                log("exiting")
                os._exit(0)
        except Exception as e:  # noqa
            try:
                conn.sendall((json.dumps({"error": str(e)}) + "\n").encode())
            except OSError:
                pass
        finally:
            conn.close()


def sup_request(rundir, req, timeout=30):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(os.path.join(rundir, "supervisor.sock"))
    except OSError as e:
        die("cannot reach the lab supervisor in %s: %s" % (rundir, e))
    s.sendall((json.dumps(req) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    if not data:
        die("supervisor closed the connection without an answer")
    rep = json.loads(data.decode())
    if "error" in rep:
        die("supervisor: " + rep["error"])
    return rep


# ----------------------------------------------------------------------------- guest agent
def serve(port):
    """PID 1 in the guest: runs commands, reaps every process (orphans included)."""
    lock = threading.Lock()
    waiting = {}  # pid -> [event, status]

    def reaper():
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.2)
                continue
            except InterruptedError:
                continue
            with lock:
                w = waiting.get(pid)
                if w is not None:
                    w[1] = status
                    w[0].set()

    threading.Thread(target=reaper, daemon=True).start()

    def send(conn, kind, payload, wlock):
        with wlock:
            conn.sendall(kind + struct.pack(">I", len(payload)) + payload)

    def handle(conn):
        wlock = threading.Lock()
        pid = None
        try:
            f = conn.makefile("rb")
            line = f.readline()
            if not line:
                return
            req = json.loads(line.decode())
            if req.get("op") == "clock":  # answer the guest's wall clock at once
                send(conn, b"x", repr(time.time()).encode(), wlock)
                return
            if req.get("op") == "adjust":  # step the guest's wall clock by delta seconds
                time.clock_settime(time.CLOCK_REALTIME, time.time() + float(req["delta"]))
                send(conn, b"x", b"0", wlock)
                return
            outr, outw = os.pipe()
            errr, errw = os.pipe()
            ev = threading.Event()
            with lock:
                pid = os.fork()
                if pid == 0:
                    try:
                        os.setsid()
                        fd = os.open("/dev/null", os.O_RDONLY)
                        os.dup2(fd, 0)
                        os.dup2(outw, 1)
                        os.dup2(errw, 2)
                        os.closerange(3, 65536)
                        os.chdir(req.get("cwd") or "/root")
                        os.execve("/bin/sh", ["sh", "-c", req["cmd"]], os.environ.copy())
                    finally:
                        os._exit(127)
                waiting[pid] = [ev, None]
            os.close(outw)
            os.close(errw)

            def pump(fd, kind):
                while True:
                    try:
                        b = os.read(fd, 65536)
                    except OSError:
                        b = b""
                    if not b:
                        break
                    try:
                        send(conn, kind, b, wlock)
                    except OSError:
                        break
                os.close(fd)

            pumps = [threading.Thread(target=pump, args=(outr, b"o"), daemon=True),
                     threading.Thread(target=pump, args=(errr, b"e"), daemon=True)]
            for p in pumps:
                p.start()

            def watch_client():  # client went away -> kill the command's process group
                try:
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass
                if not ev.is_set():
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass

            threading.Thread(target=watch_client, daemon=True).start()
            ev.wait()
            for p in pumps:
                p.join()
            with lock:
                status = waiting.pop(pid)[1]
            if os.WIFSIGNALED(status):
                code = 128 + os.WTERMSIG(status)
            else:
                code = os.WEXITSTATUS(status)
            send(conn, b"x", str(code).encode(), wlock)
        except Exception as e:  # noqa
            try:
                send(conn, b"e", ("lab agent error: %s\n" % e).encode(), threading.Lock())
            except OSError:
                pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    os.environ.update({"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "HOME": "/root", "USER": "root", "LOGNAME": "root", "LANG": "C.UTF-8"})
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    with open("/dev/console", "w") as c:
        c.write("LH-READY %s uptime %s\n" % (socket.gethostname(), open("/proc/uptime").read().split()[0]))
    while True:
        try:
            conn, _ = srv.accept()
        except InterruptedError:
            continue
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


# ----------------------------------------------------------------------------- host client
class ChannelError(Exception):
    pass


def run_remote(port, cmd, out=None, err=None, connect_timeout=5.0, timeout=None, op=None, **kw):
    """Returns the exit status; raises ChannelError when the channel broke."""
    s = socket.create_connection(("127.0.0.1", port), timeout=connect_timeout)
    s.settimeout(timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    req = {"cmd": cmd}
    if op:
        req["op"] = op
        req.update(kw)
    s.sendall((json.dumps(req) + "\n").encode())
    f = s.makefile("rb")
    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr.buffer
    try:
        while True:
            hdr = f.read(5)
            if len(hdr) < 5:
                raise ChannelError("connection closed before the command's exit status arrived")
            kind, n = hdr[:1], struct.unpack(">I", hdr[1:])[0]
            payload = f.read(n)
            if len(payload) < n:
                raise ChannelError("connection closed in the middle of a frame")
            if kind == b"o":
                out.write(payload)
                out.flush()
            elif kind == b"e":
                err.write(payload)
                err.flush()
            elif kind == b"x":
                return float(payload) if op == "clock" else int(payload)
    finally:
        s.close()


def exec_cmd(port, cmd):
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    try:
        code = run_remote(port, cmd)
    except (OSError, ChannelError) as e:
        sys.stderr.write("lab exec: command channel to 127.0.0.1:%d failed: %s\n" % (port, e))
        sys.exit(255)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)


def clock_offset(port):
    """(guest - host) wall clock offset estimated NTP-style, and the round trip time."""
    best = None
    for _ in range(5):
        t0 = time.time()
        g = run_remote(port, "", op="clock", timeout=5)
        t1 = time.time()
        if best is None or t1 - t0 < best[1]:
            best = (g - (t0 + t1) / 2, t1 - t0)
    return best


def sync_clock(port):
    """Step the guest's clock to the host's (guests' RTC has 1 s resolution)."""
    for _ in range(4):
        off, rtt = clock_offset(port)
        if abs(off) < 0.02:
            return off, rtt
        run_remote(port, "", op="adjust", delta=-off, timeout=5)
    return clock_offset(port)


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join("    | " + l for l in lines[-n:])
    except OSError as e:
        return "    (no console log: %s)" % e


def wait_guest(name, port, pidfile, console, timeout):
    t0 = time.time()
    deadline = t0 + timeout
    with open(pidfile) as f:
        pid = int(f.read())
    last = "no answer yet"
    while time.time() < deadline:
        if not pid_alive(pid):
            die("guest %s: its VM (pid %d) exited during boot. Console tail:\n%s"
                % (name, pid, tail(console)), 1)
        try:
            with open(console, "rb") as c:
                con = c.read()
            if b"LH-FAIL" in con:
                die("guest %s failed during boot. Console tail:\n%s" % (name, tail(console)), 1)
        except OSError:
            pass
        try:
            import io
            buf = io.BytesIO()
            code = run_remote(port, "hostname", out=buf, err=io.BytesIO(), connect_timeout=2,
                              timeout=10)
            got = buf.getvalue().decode().strip()
            if code == 0 and got == name:
                ready = time.time() - t0
                off, rtt = sync_clock(port)
                print("guest %s ready after %.1f s (clock offset after sync %+.3f s, rtt %.3f s)"
                      % (name, ready, off, rtt))
                return
            last = "probe answered %r status %d" % (got, code)
        except (OSError, ChannelError) as e:
            last = str(e)
        time.sleep(0.25)
    die("guest %s not ready after %d s (last probe: %s). Console tail:\n%s"
        % (name, timeout, last, tail(console)), 1)


def wait_port(port, timeout, pidfile):
    deadline = time.time() + timeout
    with open(pidfile) as f:
        pid = int(f.read())
    while time.time() < deadline:
        if not pid_alive(pid):
            die("process %d (%s) exited before 127.0.0.1:%d accepted connections"
                % (pid, pidfile, port), 1)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    die("127.0.0.1:%d did not accept connections within %d s" % (port, timeout), 1)


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    op = argv[1]
    if op == "supervise":
        supervise(argv[2])
    elif op == "spawn":
        rundir, name, logf = argv[2], argv[3], argv[4]
        assert argv[5] == "--"
        rep = sup_request(rundir, {"op": "spawn", "name": name, "log": logf, "argv": argv[6:],
                                   "env": dict(os.environ)})
        print(rep["pid"])
    elif op == "shutdown":
        sup_request(argv[2], {"op": "shutdown"}, timeout=60)
    elif op == "serve":
        serve(int(argv[2]))
    elif op == "exec":
        exec_cmd(int(argv[2]), " ".join(argv[3:]) if len(argv) > 4 else argv[3])
    elif op == "wait":
        wait_guest(argv[2], int(argv[3]), argv[4], argv[5], float(argv[6]))
    elif op == "waitport":
        wait_port(int(argv[2]), float(argv[3]), argv[4])
    elif op == "clock":
        off, rtt = clock_offset(int(argv[2]))
        print("%+.3f %.3f" % (off, rtt))
    elif op == "freeport":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])
        s.close()
    else:
        die("unknown operation %r" % op)


if __name__ == "__main__":
    main(sys.argv)
