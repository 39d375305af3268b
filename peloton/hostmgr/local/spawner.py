"""The spawner: a small helper process of the local backend that starts task wrappers, so that starting processes
never competes with the daemon's own threads for the daemon's interpreter lock (CPython's posix_spawn holds it
through vfork and exec) and runs on another core.

The daemon keeps a few of these (one per launch in progress, see SpawnerPool in spawn.py), each started once with
`python -I -S <this file>` (standard library only, no site: it starts in milliseconds) and spoken to over a Unix
stream socket (its descriptor number is the argument): length-prefixed JSON requests, each a list of tasks to start in order; replies with
each task's pid and, passed with SCM_RIGHTS, a pidfd opened at once (so the daemon watches exactly that process,
whatever happens to its pid). It stops at the first task that cannot be started. It exits when the socket closes
(the daemon stopped or died); the tasks, in their own sessions, run on.

What a task runs, started with posix_spawn in a new session (so it leads its process group and outlives the daemon),
with every signal disposition and the signal mask back to the defaults (Python ignores SIGPIPE and SIGXFSZ, and
posix_spawn, unlike subprocess, keeps what is ignored): `/bin/sh` running WRAPPER in the sandbox, which
- writes its pid to `pids` (a daemon killed between spawning and recording the pid finds it there);
- catches SIGTERM (a handler, not "ignore": exec resets caught signals to their default, so the command stays
  killable) so that a SIGTERM to the group stops the command while the wrapper still records the result;
- runs the command with `/bin/sh -c` in `work/` (so `$$` and `exit` in the command are the command's own);
- writes the command's exit status to `exit` (the file's mtime is when it ended);
- SIGKILLs its whole process group, like a container being torn down; the daemon then kills what is left in the
  task's cgroup (a process that setsid()s leaves the group, not the cgroup).
posix_spawn returns once /bin/sh has been executed: from then on the command is being run (RUNNING).

A task with a `cgroup` (cgroups.py) runs WRAPPER_GATED, which waits before it runs anything for a line `go` on its
stdin, a pipe from the spawner (then /dev/null): the spawner creates the cgroup, starts the wrapper, replies, and
only then moves the wrappers of the request into their cgroups and lets them go; a wrapper that gets no `go` (the
move failed, the spawner died) exits 125 without running the command. Moving a process between cgroups waits for
an RCU grace period when none has moved lately (10-15 ms here, once per burst), which is thus not on the launch's
path; the command starts that much after RUNNING is reported. A task with `subreaper` instead
(no cgroups: descendants.py) is started by fork and exec, the child making itself a child subreaper in between
(PR_SET_CHILD_SUBREAPER survives execve; posix_spawn cannot set it), and runs WRAPPER_SUBREAPER, which kills the
command's orphans, now its children, before it ends.

A task with a user (task.user) other than the spawner's own is started by subprocess's fork and exec instead
(spawn_as: posix_spawn cannot change user), whose child enters the sandbox before it drops to the user, so the
task needs no permission on the directories above its sandbox. The sandbox, its `work/`, files and logs are the
user's (0700/0600); HOME, USER and LOGNAME are the user's unless the job sets them. uid 0 is refused unless the
task names root explicitly (its pool allows it: checked at submit) or the daemon's --default-task-user is root.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import pwd
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys

SHELL = "/bin/sh"
PIDS_FILE = "pids"
EXIT_FILE = "exit"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
WORK_DIR = "work"

# `cd -P`: physical, so `cd ..` is the sandbox whatever `work` was made into meanwhile (a logical cd would go by
# the path it came by). `pids` and `exit` are written under an owner-only umask (in a subshell, whose $$ is still
# the wrapper's), the command keeps the umask it was given.
_ENTER = """cd -P "$1" || exit 127
(umask 077 && echo $$ > pids)
"""
_RUN = """trap : TERM
cd -P work && /bin/sh -c "$2"
rc=$?
cd -P .. && (umask 077 && echo $rc > exit)
"""
WRAPPER = _ENTER + _RUN + "kill -KILL 0\n"

# The wrapper of a task with a cgroup of its own: its first two lines, then the gate (see above), then the rest.
_GATE = """read -r gate && [ "$gate" = go ] || { echo "peloton: the task could not be put into its cgroup" >&2; exit 125; }
exec </dev/null
"""
WRAPPER_GATED = _ENTER + _GATE + _RUN + "kill -KILL 0\n"

# The wrapper of a task with no cgroup of its own (cgroups.py): it is a child subreaper (set before it is executed),
# so the command's orphans, whatever session or group they moved to, are reparented to it. Once the command ended
# it SIGKILLs them, a level of the tree a round (each round's orphans are its children in the next), reaping as it
# goes (`wait $!` on a job reaps every child that ends meanwhile; dash reaps no other way): the first round waits on
# `:` (what is left is often a zombie already: a child of the command's shell, reparented as it died), the second
# on a 2 ms sleep (SIGKILLed, not dead yet), the others on 20 ms. At most 100 rounds (2 s or more): a process that
# cannot die (uninterruptible sleep) is left to init. Then its group.
WRAPPER_SUBREAPER = _ENTER + _RUN + """n=0
while read -r k < /proc/$$/task/$$/children; [ -n "$k" ] && [ $n -lt 100 ]; do
kill -STOP $k 2>/dev/null; kill -KILL $k 2>/dev/null
case $n in 0) : & wait $! ;; 1) /bin/sleep 0.002 & wait $! ;; *) /bin/sleep 0.02 & wait $! ;; esac; n=$((n+1))
done
kill -KILL 0
"""
PR_SET_CHILD_SUBREAPER = 36


_OUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND
_HEADER = struct.Struct("!I")
_DEFAULT_SIGNALS = tuple(s for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM,
                                     signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2))


def spawn(sandbox: str, command: str, env: dict[str, str], subreaper: bool = False, gate: int | None = None) -> int:
    """Start the wrapper for `command` in `sandbox` (with its `work/`); its pid is the task's process group id.
    With `subreaper`, the wrapper is a child subreaper (posix_spawn cannot do that: fork, then exec). With `gate`
    (the read end of a pipe), WRAPPER_GATED, which waits for `go` on it.
    Raises ValueError (NUL bytes) or OSError (E2BIG: too large for exec; ENOENT/EACCES: no shell)."""
    if subreaper:
        return _spawn_subreaper(sandbox, command, env)
    return os.posix_spawn(
        SHELL, [SHELL, "-c", WRAPPER if gate is None else WRAPPER_GATED, "peloton-task", sandbox, command], env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0) if gate is None else
            (os.POSIX_SPAWN_DUP2, gate, 0),
            (os.POSIX_SPAWN_OPEN, 1, f"{sandbox}/{STDOUT_FILE}", _OUT_FLAGS, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, f"{sandbox}/{STDERR_FILE}", _OUT_FLAGS, 0o600),
        ],
        setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=(),
    )


def _spawn_subreaper(sandbox: str, command: str, env: dict[str, str]) -> int:
    logs = []
    try:
        for name in (STDOUT_FILE, STDERR_FILE):
            logs.append(os.open(f"{sandbox}/{name}", _OUT_FLAGS | os.O_CLOEXEC, 0o600))
        p = subprocess.Popen(
            [SHELL, "-c", WRAPPER_SUBREAPER, "peloton-task", sandbox, command], executable=SHELL, env=env,
            stdin=subprocess.DEVNULL, stdout=logs[0], stderr=logs[1], close_fds=True, start_new_session=True,
            preexec_fn=_become_subreaper)
    except subprocess.SubprocessError as e:
        raise OSError(errno.EIO, str(e)) from None
    finally:
        for fd in logs:
            os.close(fd)
    p.returncode = 0  # the daemon watches it through a pidfd: Popen must not keep it to wait for
    return p.pid


_libc: list[object] = []  # ctypes' libc (3 ms to import), loaded at the first task that needs prctl


def _load_libc() -> None:
    if not _libc:
        import ctypes

        _libc.append(ctypes.CDLL(None, use_errno=True))


def _become_subreaper() -> None:
    """In the child, before the wrapper is executed (it survives execve): a child subreaper, with every signal at
    its default and none blocked (as posix_spawn's setsigdef and setsigmask do)."""
    import ctypes  # loaded already (_load_libc)

    for s in _DEFAULT_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if _libc[0].prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # type: ignore[attr-defined]
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def spawn_as(sandbox: str, command: str, env: dict[str, str], who: pwd.struct_passwd,
             subreaper: bool = False, gate: int | None = None) -> int:
    """spawn(), as the user `who` (the spawner runs as root). posix_spawn cannot change user, so this is
    subprocess's fork and exec, whose child runs C only: it enters the sandbox (still root: the user needs no
    permission on the directories above it), drops to the user's groups, gid and uid, and executes the wrapper with
    `.` for the sandbox (its absolute path is the last argument, for is_wrapper). The logs are created here, as
    root, only if nothing is in their place (O_EXCL, O_NOFOLLOW: the user owns the sandbox already), and given to
    the user. Raises OSError as spawn()."""
    new = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
    logs = []
    try:
        for name in (STDOUT_FILE, STDERR_FILE):
            logs.append(os.open(f"{sandbox}/{name}", new, 0o600))
            os.fchown(logs[-1], who.pw_uid, who.pw_gid)
        p = subprocess.Popen(
            [SHELL, "-c", WRAPPER_SUBREAPER if subreaper else WRAPPER if gate is None else WRAPPER_GATED,
             "peloton-task", ".", command, sandbox],
            executable=SHELL, cwd=sandbox, env=env,
            stdin=subprocess.DEVNULL if gate is None else gate, stdout=logs[0], stderr=logs[1], close_fds=True,
            start_new_session=True,
            restore_signals=True, user=who.pw_uid, group=who.pw_gid,
            extra_groups=[] if who.pw_name.startswith("#") else os.getgrouplist(who.pw_name, who.pw_gid),
            preexec_fn=_become_subreaper if subreaper else None)
    except subprocess.SubprocessError as e:
        raise OSError(errno.EIO, str(e)) from None
    finally:
        for fd in logs:
            os.close(fd)
    p.returncode = 0  # the daemon watches it through a pidfd: Popen must not keep it to wait for
    return p.pid


class Refused(Exception):
    """A task that must not start as its user (permanent)."""


def run_as(user: str, root_allowed: bool) -> pwd.struct_passwd | None:
    """The user a task switches to; None: it runs as the spawner's own user. Raises Refused. `#<uid>` is a uid
    allocated to the job's owner (peloton/security/run_as.py): no account of this host may have it, as user or group; its
    HOME is the task's work dir (pw_dir empty) and it has no groups but its own."""
    if not user:
        return None
    if user.startswith("#"):
        return _allocated(user)
    try:
        who = pwd.getpwnam(user)
    except KeyError:
        raise Refused(f"task.user: there is no user {user!r} on this host") from None
    if who.pw_uid == 0 and not root_allowed:
        raise Refused(f"task.user: {user} is uid 0; a task runs as root only when it names root in a pool that "
                      "allows it (or when the daemon's --default-task-user is root)")
    me = os.geteuid()
    if who.pw_uid == me:
        return None
    if me != 0:
        raise Refused(f"task.user: cannot run as {user}: the daemon runs as {_name_of(me)}, not root")
    return who


def _allocated(user: str) -> pwd.struct_passwd:
    try:
        uid = int(user[1:])
    except ValueError:
        raise Refused(f"task.user: {user!r} is not a uid") from None
    if uid < 1000:
        raise Refused(f"task.user: uid {uid} is a system uid; allocated uids come from --task-uid-range")
    for lookup, what in ((pwd.getpwuid, "user"), (grp.getgrgid, "group")):
        try:
            name = lookup(uid)[0]
        except KeyError:
            continue
        # the account was made after the uid was allocated: running as it would share files with its owner
        raise Refused(f"task.user: uid {uid}, allocated to this job's owner, is this host's {what} {name!r} now; "
                      "choose a --task-uid-range clear of the host's accounts, or map the principal to a user")
    if os.geteuid() != 0:
        raise Refused(f"task.user: cannot run as uid {uid}: the daemon runs as {_name_of(os.geteuid())}, not root")
    return pwd.struct_passwd((user, "x", uid, uid, "", "", "/bin/sh"))


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def describe(e: BaseException) -> tuple[str, bool]:
    """(message, permanent) for a task that could not be started."""
    if isinstance(e, ValueError):  # an embedded NUL byte in the command or the environment
        return f"the command cannot be started: {e}", True
    if isinstance(e, OSError):
        if e.errno == errno.E2BIG:
            return "the command and its environment are too large to start (Argument list too long)", True
        if e.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.EPERM):
            return f"cannot start {SHELL}: {e.strerror}", True
        return f"cannot start the task: {e.strerror or e}", False
    return f"cannot start the task: {e}", False


def prepare(sandbox: str, files: dict[str, str], who: pwd.struct_passwd | None = None) -> None:
    """A fresh sandbox with its `work/` and the launch's files (an earlier try of the same task id is removed:
    it is not running), all given to the user `who` when the task runs as another user."""
    if os.path.lexists(sandbox):
        shutil.rmtree(sandbox)  # never follows a symlink the task's user left inside
    os.mkdir(sandbox, 0o700)  # owner-only: the logs and files of a task are its submitter's business
    made = [sandbox, os.path.join(sandbox, WORK_DIR)]
    os.mkdir(made[1], 0o700)
    for name, content in files.items():
        path = os.path.join(sandbox, name)
        parent = os.path.dirname(path)
        missing = []
        while not os.path.isdir(parent):  # each 0700 (makedirs would give those above the last the umask's mode)
            missing.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(missing):
            os.mkdir(d, 0o700)
            made.append(d)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(content)
        made.append(path)
    if who is not None:  # nobody else can reach it yet: the sandboxes directory is the daemon's
        for path in made:
            os.chown(path, who.pw_uid, who.pw_gid, follow_symlinks=False)


def start(task: dict[str, object], base_env: dict[str, str]) -> tuple[dict[str, object], int | None]:
    """Start one task: (its reply entry, its pidfd or None)."""
    sandbox = str(task["sandbox"])
    try:
        who = run_as(str(task.get("user") or ""), bool(task.get("root_allowed")))
    except Refused as e:
        return {"error": str(e), "permanent": True}, None
    try:
        prepare(sandbox, dict(task.get("files") or {}), who)  # type: ignore[call-overload]
    except OSError as e:
        return {"error": f"cannot prepare the sandbox: {e}", "permanent": False}, None
    env = dict(base_env)
    if who is not None:  # not the daemon's home (an allocated uid has none: its work dir)
        env.update(HOME=who.pw_dir or os.path.join(sandbox, WORK_DIR), USER=who.pw_name, LOGNAME=who.pw_name)
    env.update(task.get("env") or {})  # type: ignore[call-overload]
    cgroup = str(task.get("cgroup") or "")
    subreaper = bool(task.get("subreaper"))
    if subreaper:
        _load_libc()
    gate = None
    if cgroup:
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(cgroup, 0o755)
        except OSError as e:
            return {"error": f"cannot make the task's cgroup {cgroup}: {e.strerror}", "permanent": False}, None
        gate = os.pipe2(os.O_CLOEXEC)
    try:
        if who is None:
            pid = spawn(sandbox, str(task["command"]), env, subreaper, gate[0] if gate else None)
        else:
            pid = spawn_as(sandbox, str(task["command"]), env, who, subreaper, gate[0] if gate else None)
    except (ValueError, OSError) as e:
        if gate:
            os.close(gate[1])
        msg, permanent = describe(e)
        return {"error": msg, "permanent": permanent}, None
    finally:
        if gate:
            os.close(gate[0])
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already over and reaped: the daemon reads its exit file
        if gate:
            os.close(gate[1])
        return {"pid": pid, "pidfd": False}, None
    if gate:
        _gated.append((os.dup(fd), pid, cgroup, gate[1]))
    return {"pid": pid, "pidfd": True}, fd


# (a pidfd, the pid, the cgroup, the gate's write end) of each wrapper started and not let go yet
_gated: list[tuple[int, int, str, int]] = []


def _let_go() -> None:
    """Move each gated wrapper into its cgroup, then let it run its command; one that cannot be moved gets no `go`
    and ends without running anything (its gate is closed). A wrapper that has ended meanwhile (killed at once) is
    not moved: its pid may be another process's by now (this process ignores SIGCHLD, so its children are reaped
    as they end; the check and the move are a few microseconds apart, as for any signal sent by pid)."""
    while _gated:
        pidfd, pid, cgroup, gate = _gated.pop(0)
        try:
            if select.select([pidfd], [], [], 0)[0]:
                continue  # ended
            try:
                fd = os.open(f"{cgroup}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, str(pid).encode())
                finally:
                    os.close(fd)
            except OSError as e:
                if e.errno not in (errno.ESRCH, errno.ENOENT):  # gone already: killed, its cgroup removed
                    sys.stderr.write(f"peloton spawner: cannot move {pid} into {cgroup}: {e.strerror}\n")
                continue
            with contextlib.suppress(OSError):  # EPIPE: it died meanwhile
                os.write(gate, b"go\n")
        finally:
            os.close(gate)
            os.close(pidfd)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def serve(sock: socket.socket) -> None:
    base_env = dict(os.environ)
    while True:
        try:
            (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
            request = json.loads(_read_exact(sock, size))
        except (EOFError, ConnectionError):
            return
        replies: list[dict[str, object]] = []
        fds: list[int] = []
        for task in request["tasks"]:
            entry, fd = start(task, base_env)
            replies.append(entry)
            if fd is not None:
                fds.append(fd)
            if "error" in entry:
                break
        body = json.dumps({"results": replies}).encode()
        frame = _HEADER.pack(len(body)) + body
        try:
            sent = sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(_ints(fds)))] if fds else [])
            if sent < len(frame):
                sock.sendall(frame[sent:])
        except (BrokenPipeError, ConnectionError):
            return
        finally:
            for fd in fds:
                os.close(fd)
            _let_go()  # after the reply (the daemon reports RUNNING meanwhile), whether it arrived or not


def _ints(fds: list[int]) -> bytes:
    return struct.pack(f"{len(fds)}i", *fds)


def main() -> int:
    # Children are reaped by the kernel (the daemon learns of their end through the pidfds and the exit files).
    # SIGINT stays at its default, for the tasks started by fork to inherit: the spawner is in a session of its
    # own (spawn.py), so Ctrl-C at the daemon's terminal never reaches it.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    fd = int(sys.argv[1])  # the daemon's end of the socket pair is its; this is ours
    os.set_inheritable(fd, False)  # never into a task
    sock = socket.socket(fileno=fd)
    try:
        serve(sock)
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
