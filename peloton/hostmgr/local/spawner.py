"""The spawner: a small helper process of the local backend that starts task wrappers, so that starting processes
never competes with the daemon's own threads for the daemon's interpreter lock (CPython's posix_spawn holds it
through vfork and exec) and runs on another core.

The daemon keeps a few of these (SpawnerPool in spawn.py: a launch splits its members over the free ones), each
started once with `python -I -S <this file>` (standard library only, no site: it starts in milliseconds) and spoken
to over a Unix stream socket (its descriptor number is the argument): length-prefixed JSON requests, each a list of
tasks to start in order; replies with each task's pid and, passed with SCM_RIGHTS, a pidfd opened at once (so the
daemon watches exactly that process, whatever happens to its pid). A task that cannot be started ends the request,
or, for tasks with a `group` (their gang), makes it skip the rest of that group (`{"skipped": true}`). It exits
when the socket closes (the daemon stopped or died); the tasks, in their own sessions, run on.

What a task runs, started with posix_spawn in a new session (so it leads its process group and outlives the daemon),
with every signal disposition and the signal mask back to the defaults (Python ignores SIGPIPE and SIGXFSZ, and
posix_spawn, unlike subprocess, keeps what is ignored): `/bin/sh` running WRAPPER in the sandbox, which
- writes its pid to `pids` (a daemon killed between spawning and recording the pid finds it there);
- catches SIGTERM (a handler, not "ignore": exec resets caught signals to their default, so the command stays
  killable) so that a SIGTERM to the group stops the command while the wrapper still records the result;
- runs the command in `work/`: executed directly when it has no shell syntax (argv_of: the rule is there), else with
  `/bin/sh -c` (so `$$` and `exit` in the command are the command's own);
- writes the command's exit status to `exit` (the file's mtime is when it ended);
- SIGKILLs its whole process group, like a container being torn down; the daemon then kills what is left in the
  task's cgroup (a process that setsid()s leaves the group, not the cgroup).
posix_spawn returns once /bin/sh has been executed: from then on the command is being run (RUNNING). A gated task
may instead be handed a warm wrapper, one started ahead of its launch, which becomes its wrapper at `go` (below).

A task with a `cgroup` (cgroups.py) runs WRAPPER_GATED, which waits before it runs anything for a line `go` on its
stdin, a pipe from the spawner (then /dev/null): the spawner creates the cgroup, starts the wrapper, replies, and
only then, when the daemon says so (a `{"go": true}` frame, sent once every spawner of the launch has answered; the
daemon's socket closing; or GO_WAIT_S without either), moves the wrappers of the request into their cgroups and lets
them go; a wrapper that gets no `go` (the move failed, the spawner died) exits 125 without running the command.
Moving a process between cgroups waits for an RCU grace period when none has moved lately (10-15 ms here, once per
burst), and while it waits every fork on the machine (the cgroup_threadgroup_rwsem) and every cgroup mkdir (the
cgroup mutex) waits too: hence after the replies, where it is not on the launch's path, and after all of them, where
it stalls no other spawner of the same launch; the command starts that much after RUNNING is reported. A task with
`subreaper` instead (no cgroups: descendants.py) is started by fork and exec, the child making itself a child
subreaper in between (PR_SET_CHILD_SUBREAPER survives execve; posix_spawn cannot set it), and runs
WRAPPER_SUBREAPER, which kills the command's orphans, now its children, before it ends.

A task with a user (task.user) other than the spawner's own is started, when gated, by that user's launcher (a
child of the spawner that runs as the user: start_all, launch_all), else by posix_spawn of util-linux's setpriv in the
sandbox, which drops to the user and executes the wrapper in the same process (spawn_as: posix_spawn cannot change
user; without setpriv, and for a child subreaper, subprocess's fork and exec, whose child enters the sandbox before
it drops to the user); either way the task needs no permission on the directories above its sandbox. The sandbox, its `work/`, files and logs are the
user's (0700/0600); HOME, USER and LOGNAME are the user's unless the job sets them. uid 0 is refused unless the
task names root explicitly (its pool allows it: checked at submit) or the daemon's --default-task-user is root.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import grp
import json
import os
import pwd
import re
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # imported: the daemon, tests
    from peloton.security import nss
else:  # run as a script (python -I -S): no peloton on the path, so the file by its path (stdlib only)
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "peloton_nss", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "security", "nss.py"))
    nss = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(nss)

SHELL = "/bin/sh"
PIDS_FILE = "pids"
EXIT_FILE = "exit"
STDOUT_FILE = "stdout"
STDERR_FILE = "stderr"
WORK_DIR = "work"

# `cd -P`: physical, so `cd ..` is the sandbox whatever `work` was made into meanwhile (a logical cd would go by
# the path it came by). `pids` and `exit` are written under an owner-only umask, set by the wrapper's own shell (a
# builtin: no fork, where a `( ... )` subshell costs dash a fork each), and the umask it was given (UMASK_MARK: the
# spawner's, wrapper_of puts it in) is set back before the command runs, so the command keeps it. After the command
# nothing is created that the umask would matter for.
UMASK_MARK = "@UMASK@"
_ENTER = """cd -P "$1" || exit 127
umask 077; echo $$ > pids; umask @UMASK@
"""
_RUN = """trap : TERM
cd -P work && /bin/sh -c "$2"
rc=$?
cd -P .. && umask 077 && echo $rc > exit
"""
# The same, for a command executed directly (argv_of): its argv follows the sandbox and the sandbox's absolute path.
# Its first word is never a name the wrapper's shell would take for a builtin or keyword (_SHELL_WORDS).
_RUN_DIRECT = _RUN.replace('/bin/sh -c "$2"', 'shift 2 && "$@"')
WRAPPER = _ENTER + _RUN + "kill -KILL 0\n"

# The wrapper of a task with a cgroup of its own: its first two lines, then the gate (see above), then the rest.
_NOT_MOVED = "peloton: the task could not be put into its cgroup"
_GATE = f"""read -r gate && [ "$gate" = go ] || {{ echo "{_NOT_MOVED}" >&2; exit 125; }}
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


def wrapper_of(gate: bool, subreaper: bool, direct: bool, umask: int) -> str:
    """The wrapper's text: WRAPPER, WRAPPER_GATED or WRAPPER_SUBREAPER, running the command directly or not, giving
    the command `umask` (the one the wrapper is started with)."""
    text = WRAPPER_SUBREAPER if subreaper else WRAPPER_GATED if gate else WRAPPER
    text = text.replace(_RUN, _RUN_DIRECT) if direct else text
    return text.replace(UMASK_MARK, f"{umask & 0o777:04o}")


_UMASK: list[int] = []  # the spawner's umask, read once in main(): nothing changes it there


def current_umask() -> int:
    """This process's umask, without setting it (os.umask can only set it, which would race another thread's file
    creation): /proc/self/status's `Umask:` line (Linux >= 4.7); in the spawner, the one main() read."""
    if _UMASK:
        return _UMASK[0]
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError(errno.ENOSYS, "/proc/self/status has no Umask line")


# ---------------------------------------------------------------------------------------------- direct exec
# A command is executed without `/bin/sh -c` when a shell would do nothing with it but split it into words
# (argv_of). The rule, conservatively (anything else runs under /bin/sh -c exactly as before):
# - outside quotes, only letters, digits, `_ - . / , : + = @ %` and blanks (space, tab) between words;
# - '...' (anything but `'` inside) and "..." (anything but `"`, `$`, a backquote and `\` inside);
# - the first word is not a shell reserved word or builtin (_SHELL_WORDS: `echo`, `exec`, `cd`, `test`, ...) and
#   has no `=` (an assignment);
# - the first word has a `/` (run as it is, from work/), or is found as an executable file in the task's PATH, whose
#   entries are all absolute (the wrapper's shell looks it up there, argv[0] as written: a name not found is left to
#   `sh -c` and its 127).
# So `$VAR`, `~`, globs, `;`, `&&`, `|`, redirections, `#`, `\`, subshells and `VAR=x cmd` all keep the shell; a
# command forces one with any of them (`exec cmd ...` is the cheapest: the shell execs the command in its place),
# and passes such characters to a program without one by single-quoting them.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./,:+=@%")
_IN_DOUBLE_QUOTES_NOT = frozenset('"$`\\')
_SHELL_WORDS = frozenset((
    # reserved words (POSIX, dash, bash)
    "!", "{", "}", "case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in", "then", "until", "while",
    "function", "select", "time", "coproc", "[[", "]]",
    # dash's builtins (and bash's that a script may expect), special or not
    ".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo", "eval", "exec", "exit",
    "export", "false", "fc", "fg", "getopts", "hash", "jobs", "kill", "local", "printf", "pwd", "read", "readonly",
    "return", "set", "shift", "test", "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset",
    "wait", "source", "let", "declare", "typeset", "shopt", "builtin", "enable", "help", "history", "logout",
    "mapfile", "readarray", "suspend", "disown", "dirs", "popd", "pushd", "bind", "caller", "compgen", "complete",
    "compopt",
))


def split_plain(command: str) -> list[str] | None:
    """The words of `command` when a shell would only split it into words and remove quotes (the rule above, but
    for the first word's lookup); None when it needs the shell."""
    words: list[str] = []
    word: list[str] = []
    in_word = False
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        if c in " \t":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            i += 1
            continue
        if c in _PLAIN:
            word.append(c)
        elif c in "'\"":
            end = command.find(c, i + 1)
            if end < 0:
                return None  # unterminated: the shell's syntax error
            part = command[i + 1:end]
            if c == '"' and any(ch in _IN_DOUBLE_QUOTES_NOT for ch in part):
                return None
            word.append(part)
            i = end
        else:
            return None
        in_word = True
        i += 1
    if in_word:
        words.append("".join(word))
    if not words or not words[0] or words[0] in _SHELL_WORDS or "=" in words[0]:
        return None
    return words


def argv_of(command: str, env: dict[str, str]) -> list[str] | None:
    """The argv to execute `command` with, no shell between (the rule above); None: it runs under /bin/sh -c. The
    words are as written (argv[0] too, as a shell passes it): the wrapper's shell finds the program in the task's
    PATH as it would for `sh -c`; it is looked up here only to know it is a program of that PATH, not the shell's."""
    words = split_plain(command)
    if words is None:
        return None
    if "/" in words[0]:
        return words
    dirs = env.get("PATH", "").split(":")
    if not env.get("PATH") or any(not d.startswith("/") for d in dirs):
        return None  # the shell's default PATH, or the work dir in it: the shell's business
    for d in dirs:
        path = f"{d.rstrip('/')}/{words[0]}"
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return words
    return None  # not found: the shell says so (127) as it always did


_OUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND
_HEADER = struct.Struct("!I")
_DEFAULT_SIGNALS = tuple(s for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM,
                                     signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2))


def _args(sandbox: str, command: str, env: dict[str, str], gate: bool, subreaper: bool,
          absolute: str | None = None) -> list[str]:
    """The wrapper's argv: `sh -c WRAPPER peloton-task SANDBOX COMMAND [ABSOLUTE]`, or, for a command executed
    directly, `sh -c WRAPPER peloton-task SANDBOX ABSOLUTE ARGV...` (`absolute`: the sandbox's absolute path, which
    is_wrapper looks for, when SANDBOX is `.`)."""
    argv = argv_of(command, env)
    head = [SHELL, "-c", wrapper_of(gate, subreaper, argv is not None, current_umask()), "peloton-task", sandbox]
    if argv is None:
        return head + [command] + ([absolute] if absolute else [])
    return head + [absolute or sandbox] + argv


def spawn(sandbox: str, command: str, env: dict[str, str], subreaper: bool = False, gate: int | None = None) -> int:
    """Start the wrapper for `command` in `sandbox` (with its `work/`); its pid is the task's process group id.
    With `subreaper`, the wrapper is a child subreaper (posix_spawn cannot do that: fork, then exec). With `gate`
    (the read end of a pipe), WRAPPER_GATED, which waits for `go` on it.
    Raises ValueError (NUL bytes) or OSError (E2BIG: too large for exec; ENOENT/EACCES: no shell)."""
    if subreaper:
        return _spawn_subreaper(sandbox, command, env)
    return os.posix_spawn(
        SHELL, _args(sandbox, command, env, gate is not None, False), env,
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
            _args(sandbox, command, env, False, True), executable=SHELL, env=env,
            stdin=subprocess.DEVNULL, stdout=logs[0], stderr=logs[1], close_fds=True, start_new_session=True,
            preexec_fn=_become_subreaper)
    except subprocess.SubprocessError as e:
        raise OSError(errno.EIO, str(e)) from None
    finally:
        for fd in logs:
            os.close(fd)
    p.returncode = 0  # the daemon watches it through a pidfd: Popen must not keep it to wait for
    return p.pid


_libc = nss.LIBC  # ctypes' libc (3 ms to import), loaded by main() (prctl, nss_error)
_load_libc = nss.load_libc
nss_error = nss.nss_error


def _become_subreaper() -> None:
    """In the child, before the wrapper is executed (it survives execve): a child subreaper, with every signal at
    its default and none blocked (as posix_spawn's setsigdef and setsigmask do)."""
    import ctypes  # loaded already (_load_libc)

    for s in _DEFAULT_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if _libc[0].prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # type: ignore[attr-defined]
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


# util-linux's setpriv: how a task starts as another user by posix_spawn (which cannot change user itself)
SETPRIV = next((p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None)


def spawn_as(sandbox: str, command: str, env: dict[str, str], who: pwd.struct_passwd,
             subreaper: bool = False, gate: int | None = None) -> int:
    """spawn(), as the user `who` (the spawner runs as root). The wrapper is started in the sandbox (entered as
    root: the user needs no permission on the directories above it), with `.` for the sandbox (its absolute path
    is an argument too, for is_wrapper), as the user's groups, gid and uid. The logs are created here, as root, only
    if nothing is in their place (O_EXCL, O_NOFOLLOW: the user owns the sandbox already), and given to the user.

    (A gated task normally goes to the user's launcher instead: start_all, launch_all.) As posix_spawn cannot change
    user, this starts `setpriv` (SETPRIV), which drops to the user and executes the wrapper in the same process, so
    it costs the spawner what spawn() does (a vfork and an exec: subprocess's fork and exec, which a user switch
    needs, cost several times that and wait for the exec) and the member one program more. Without setpriv, and for a child
    subreaper (prctl between fork and exec), subprocess's fork and exec, whose child runs C only.
    Raises OSError as spawn(); a setpriv that fails (it should not, as root) ends the task before its wrapper ran
    (LOST, its message in stderr)."""
    new = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW
    logs = []
    groups = [] if who.pw_name.startswith("#") else os.getgrouplist(who.pw_name, who.pw_gid)
    args = _args(".", command, env, gate is not None, subreaper, absolute=sandbox)
    try:
        for name in (STDOUT_FILE, STDERR_FILE):
            logs.append(os.open(f"{sandbox}/{name}", new, 0o600))
            os.fchown(logs[-1], who.pw_uid, who.pw_gid)
        if SETPRIV is not None and not subreaper:
            drop = [SETPRIV, f"--reuid={who.pw_uid}", f"--regid={who.pw_gid}",
                    f"--groups={','.join(str(g) for g in groups)}" if groups else "--clear-groups", "--"]
            back = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.chdir(sandbox)  # inherited by the child (this process has one thread): setpriv keeps it
            try:
                return os.posix_spawn(
                    SETPRIV, drop + args, env,
                    file_actions=[
                        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0) if gate is None else
                        (os.POSIX_SPAWN_DUP2, gate, 0),
                        (os.POSIX_SPAWN_DUP2, logs[0], 1),
                        (os.POSIX_SPAWN_DUP2, logs[1], 2),
                    ],
                    setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=(),
                )
            finally:
                os.fchdir(back)
                os.close(back)
        p = subprocess.Popen(
            args, executable=SHELL, cwd=sandbox, env=env,
            stdin=subprocess.DEVNULL if gate is None else gate, stdout=logs[0], stderr=logs[1], close_fds=True,
            start_new_session=True, restore_signals=True, user=who.pw_uid, group=who.pw_gid, extra_groups=groups,
            preexec_fn=_become_subreaper if subreaper else None)
    except subprocess.SubprocessError as e:
        raise OSError(errno.EIO, str(e)) from None
    finally:
        for fd in logs:
            os.close(fd)
    p.returncode = 0  # the daemon watches it through a pidfd: Popen must not keep it to wait for
    return p.pid


# ------------------------------------------------------------------------------------------ a launcher per user
# A gated member of another user (it has a cgroup: every task of a root daemon but its child subreapers) is started
# by a child of this spawner that runs as that user (its groups, gid and uid; no capabilities), forked at the user's
# first such task and kept: it posix_spawns the wrapper from inside the sandbox as this process does for its own
# user, with the descriptors this process opened (the sandbox, the gate, the logs), so the member runs no program
# more than one of the spawner's own user (setpriv was one exec more, ~1 ms of CPU a member on this project's VM).
# It changed its uid, so it is not dumpable: the user's processes cannot ptrace it or read its memory, but they may
# signal it (same uid). Hence only gated tasks: a launcher found dead before a request (its pidfd), or that cannot
# take the whole request (EPIPE, or it stopped reading), is killed and the task goes through setpriv, nothing having
# been started; one that took a request and gave no answer within LAUNCHER_WAIT_S is killed and the task reported not
# started (transient): its wrapper, if it was started, gets no `go` (the gate closes) and exits 125 having run
# nothing. After such a failure that user's tasks go through setpriv for LAUNCHER_BACKOFF_S. A request's consecutive
# tasks of one user go to its launcher in one message (start_all, launch_all): one round trip, not one a task.
LAUNCHER_WAIT_S = 5.0
LAUNCHER_BACKOFF_S = 60.0
LAUNCHERS_MAX = 32  # kept per spawner, the least recently used closed beyond it (it exits at its socket's end)
LAUNCHER_IDLE_S = 600.0  # a launcher unused this long is closed (by the spawner, between requests)
PR_SET_DUMPABLE = 4
LAUNCH_BATCH_MAX = 32  # spawns a request to a launcher (4 descriptors each: SCM_RIGHTS passes at most 253)
Key = tuple[int, int, tuple[int, ...]]  # a launcher's user: uid, gid, groups
_launchers: dict[Key, Launcher] = {}  # in order of use, the latest last
_launcher_backoff: dict[Key, float] = {}  # until when a user's tasks go through setpriv
_LAUNCHERS_ON: list[bool] = []  # main() turns them on: a launcher is forked, which needs a one-thread process


class LauncherGone(Exception):
    """The launcher took nothing of the request (dead, or it stopped reading): nothing was started."""


class Launcher:
    """The spawner's end of one user's launcher (a forked child; see above)."""

    def __init__(self, uid: int, gid: int, groups: list[int]) -> None:
        _load_libc()  # here, not in the child: its pages are shared by every launcher forked after
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child: it never returns)
            code = 1
            try:
                keep = theirs.fileno()
                os.closerange(3, keep)  # the daemon's socket, the other launchers', the gates: none of its business
                os.closerange(keep + 1, 1 << 20)
                os.setgroups(groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                _libc[0].prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # type: ignore[attr-defined]  # whatever suid_dumpable says
                _serve_launches(theirs)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        self.uid = uid
        self.pid = pid
        self.used = time.monotonic()
        self.sock = ours
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:
            ours.close()
            raise
        self.sock.settimeout(LAUNCHER_WAIT_S)

    def alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]

    def launch(self, spawns: list[dict[str, object]], fds: list[int]) -> list[dict[str, object]]:
        """posix_spawn(SHELL, args, env) as the user for each of `spawns` ({"args", "env", "group"}), in order, with
        4 of `fds` each (stdin, stdout, stderr, the directory to start in): a reply each ({"pid"}, {"errno",
        "strerror"}, {"value_error"}, or {"skipped": true} after a failure of its group, or of a task of no group).
        Raises LauncherGone (nothing started) or OSError (EIO: what was started is unknown)."""
        body = json.dumps({"spawns": spawns}).encode()
        frame = _HEADER.pack(len(body)) + body
        try:
            if not self.alive():
                raise OSError(errno.ESRCH, "the launcher has ended")
            sent = self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _ints(fds))])
            if sent < len(frame):
                self.sock.sendall(frame[sent:])
        except OSError as e:  # it cannot have started anything without the whole frame, nor will it once killed
            self.close()
            raise LauncherGone(e.strerror or str(e)) from None
        try:
            (size,) = _HEADER.unpack(_read_exact(self.sock, _HEADER.size))
            replies = json.loads(_read_exact(self.sock, size))["results"]
            if len(replies) != len(spawns):
                raise ValueError("a reply a spawn")
        except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
            self.close()
            what = f"did not answer within {LAUNCHER_WAIT_S:g} s" if isinstance(e, TimeoutError) else "ended"
            raise OSError(errno.EIO, f"the launcher of uid {self.uid} {what} (one of the user's processes may "
                                     "have stopped or killed it); the task did not run") from None
        self.used = time.monotonic()
        return list(replies)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # whatever state it is in: it starts nothing more
            # by its pidfd, not its pid: one its user killed was reaped at once (SIGCHLD is ignored), and its pid may
            # be any process's by now (closed idle 10 minutes later, or found dead at a launch)
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


def _launchers_idle_in() -> float:
    """Seconds until the least recently used launcher has been idle LAUNCHER_IDLE_S (it is first in _launchers)."""
    return max(0.0, next(iter(_launchers.values())).used + LAUNCHER_IDLE_S - time.monotonic())


def _idle_in() -> float:
    """Seconds until a launcher or a warm pool has been idle long enough to go."""
    now = time.monotonic()
    times = [pool.used + WARM_IDLE_S - now for pool in _pools.values()]
    if _launchers:
        times.append(_launchers_idle_in())
    return max(0.0, min(times))


def _close_idle_launchers() -> None:
    """Close the launchers idle LAUNCHER_IDLE_S or more; only between requests (no launch is asking them)."""
    while _launchers and _launchers_idle_in() == 0.0:
        _launchers.pop(next(iter(_launchers))).close()


def recv_fds_cloexec(sock: socket.socket, size: int, maxfds: int) -> tuple[bytes, list[int]]:
    """socket.recv_fds, with the descriptors close-on-exec from their arrival (MSG_CMSG_CLOEXEC). CPython 3.11's
    recv_fds drops its flags argument: the launcher's descriptors of a whole request (every member's gate, logs
    and sandbox) were inherited by each wrapper it started, and so by each member's command; and the daemon's,
    made close-on-exec only after, by whatever another of its threads started meanwhile. ConnectionError when
    descriptors were lost on the way (MSG_CTRUNC)."""
    fds = array.array("i")
    data, ancillary, flags, _addr = sock.recvmsg(size, socket.CMSG_LEN(maxfds * fds.itemsize),
                                                 socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if flags & socket.MSG_CTRUNC:
        # some descriptors were dropped (this process is out of them, or more came than room was made for): the
        # rest would be matched to the wrong tasks, so the channel is done with
        for fd in fds:
            os.close(fd)
        raise ConnectionError("descriptors sent to this process were lost (MSG_CTRUNC): out of file descriptors?")
    return data, list(fds)


def _serve_launches(sock: socket.socket) -> None:
    """The launcher's loop (it runs as the user): a request's spawns in order, the spawner's rule for failures
    (serve: the rest of a failed task's group is skipped; a failed task of no group ends the request), until its
    socket closes."""
    while True:
        try:
            data, fds = recv_fds_cloexec(sock, _HEADER.size, 4 * LAUNCH_BATCH_MAX)
            if not data:
                return
            if len(data) < _HEADER.size:
                data += _read_exact(sock, _HEADER.size - len(data))
            (size,) = _HEADER.unpack(data)
            spawns = json.loads(_read_exact(sock, size))["spawns"]
        except (EOFError, ConnectionError):
            return
        replies: list[dict[str, object]] = []
        failed: set[object] = set()
        ended = False
        for i, sp in enumerate(spawns):
            stdin, out, err, cwd = fds[4 * i:4 * i + 4]
            group = sp.get("group")
            if ended or group in failed:
                replies.append({"skipped": True})
                continue
            try:
                os.fchdir(cwd)
                replies.append({"pid": os.posix_spawn(
                    sp.get("path", SHELL), sp["args"], sp["env"],
                    file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, out, 1),
                                  (os.POSIX_SPAWN_DUP2, err, 2)],
                    setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=())})
                continue
            except ValueError as e:
                replies.append({"value_error": str(e)})
            except OSError as e:
                replies.append({"errno": e.errno or errno.EIO, "strerror": e.strerror or str(e)})
            if group is None:
                ended = True
            else:
                failed.add(group)
        for fd in fds:
            os.close(fd)
        body = json.dumps({"results": replies}).encode()
        sock.sendall(_HEADER.pack(len(body)) + body)


def launcher_key(r: Ready) -> Key | None:
    """The launcher a Ready task goes to, or None: it goes another way (its own user, no gate, a child subreaper,
    no launchers in this process, or its user's launcher failed lately)."""
    who = r.who
    if who is None or r.gate is None or r.subreaper or not _LAUNCHERS_ON:
        return None
    groups = [] if who.pw_name.startswith("#") else os.getgrouplist(who.pw_name, who.pw_gid)
    key = (who.pw_uid, who.pw_gid, tuple(sorted(groups)))
    return None if _launcher_backoff.get(key, 0.0) > time.monotonic() else key


def back_off_launcher(key: Key, now: float) -> None:
    """The user `key`'s tasks go through setpriv for LAUNCHER_BACKOFF_S. The backoffs that ran out go meanwhile:
    a spawner lives as long as its daemon, months, and would keep one for every user whose launcher ever failed."""
    for k in [k for k, until in _launcher_backoff.items() if until <= now]:
        del _launcher_backoff[k]
    _launcher_backoff[key] = now + LAUNCHER_BACKOFF_S


def launch_all(key: Key, batch: list[tuple[Ready, object]]) -> list[tuple[dict[str, object], int | None]]:
    """Start the Ready tasks of `batch` ((task, its group)), all of one user (`key`), by that user's launcher, in
    one request: (reply entry, pidfd) each, in order. What the launcher skipped after a failure is {"skipped": true};
    what it could not take (it was gone twice, or could not be had) goes through setpriv, one by one, with the same
    rule; what it took without answering is not started (the launcher's error, transient)."""
    opened: list[int] = []
    made: list[str] = []  # the logs created here: removed again if the tasks go one by one (they create theirs)
    fds: list[int] = []
    spawns: list[dict[str, object]] = []
    try:
        for r, group in batch:
            who = r.who
            assert who is not None and r.gate is not None
            logs = _logs_for(r.sandbox, who)
            opened += logs
            made += [f"{r.sandbox}/{STDOUT_FILE}", f"{r.sandbox}/{STDERR_FILE}"]
            cwd = os.open(r.sandbox, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            opened.append(cwd)
            fds += [r.gate[0], logs[0], logs[1], cwd]
            spawns.append({"args": _args(".", r.command, r.env, True, False, absolute=r.sandbox), "env": r.env,
                           "group": group})
    except OSError:  # a log or sandbox that cannot be opened: one by one, as ever (each its own error)
        replies = None
    else:
        try:
            replies = _ask_launcher(key, spawns, fds)
        except OSError as e:  # EIO: the launcher took the request and gave no answer: none of them runs
            back_off_launcher(key, time.monotonic())
            return [(_closed(r, not_started(r, e)), None) for r, _ in batch]
        if replies is None:  # the launcher could not be had, or was gone twice: setpriv for a while
            back_off_launcher(key, time.monotonic())
    finally:
        for fd in opened:
            os.close(fd)
    if replies is None:
        for path in made:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return _one_by_one(batch)
    results: list[tuple[dict[str, object], int | None]] = []
    for (r, _group), reply in zip(batch, replies, strict=True):
        if "pid" in reply:
            os.close(r.gate[0])  # type: ignore[index]
            results.append(started(r, int(reply["pid"])))  # type: ignore[call-overload]
        elif "skipped" in reply:
            os.close(r.gate[0])  # type: ignore[index]
            os.close(r.gate[1])  # type: ignore[index]
            results.append(({"skipped": True}, None))
        else:
            err: BaseException = (ValueError(str(reply["value_error"])) if "value_error" in reply else
                                  OSError(int(reply["errno"]), str(reply["strerror"])))  # type: ignore[call-overload]
            results.append((_closed(r, not_started(r, err)), None))
    return results


def _closed(r: Ready, entry: dict[str, object]) -> dict[str, object]:
    os.close(r.gate[0])  # type: ignore[index]
    return entry


def _one_by_one(batch: list[tuple[Ready, object]]) -> list[tuple[dict[str, object], int | None]]:
    """The batch through setpriv, task by task, with serve()'s rule for failures."""
    out: list[tuple[dict[str, object], int | None]] = []
    failed: set[object] = set()
    ended = False
    for r, group in batch:
        if ended or group in failed:
            for end in r.gate or ():
                os.close(end)
            out.append(({"skipped": True}, None))
            continue
        out.append(start_now(r))
        entry = out[-1][0]
        if "error" in entry:
            ended = ended or group is None
            failed.add(group)
    return out


def _ask_launcher(key: Key, spawns: list[dict[str, object]], fds: list[int]) -> list[dict[str, object]] | None:
    """The user's launcher's replies to `spawns` (forked at need, replaced once when found gone); None: it could
    not be had or was gone twice (nothing started). Raises OSError (EIO) as Launcher.launch."""
    for _ in range(2):
        launcher = _launchers.pop(key, None)
        if launcher is None:
            while len(_launchers) >= LAUNCHERS_MAX:
                _launchers.pop(next(iter(_launchers))).close()
            try:
                launcher = Launcher(key[0], key[1], list(key[2]))
            except OSError:
                return None
        try:
            replies = launcher.launch(spawns, fds)
        except LauncherGone:
            continue
        _launchers[key] = launcher
        return replies
    return None


def _logs_for(sandbox: str, who: pwd.struct_passwd) -> list[int]:
    """The task's stdout and stderr, created here as root only if nothing is in their place (O_EXCL, O_NOFOLLOW:
    the user owns the sandbox already), and given to the user."""
    new = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    logs: list[int] = []
    try:
        for name in (STDOUT_FILE, STDERR_FILE):
            logs.append(os.open(f"{sandbox}/{name}", new, 0o600))
            os.fchown(logs[-1], who.pw_uid, who.pw_gid)
    except OSError:
        for fd in logs:
            os.close(fd)
        raise
    return logs


class Refused(Exception):
    """A task that must not start as its user (permanent)."""


class LookupFailed(Exception):
    """The user database could not answer for a task's user (transient: the task is not started, and may be tried
    again)."""


# What tells "no such user" from "the user database could not answer" (nss_error): peloton/security/nss.py, whose
# rule the job manager's uid allocation shares. A definite absence fails a task for good, as before; any other answer
# is transient, the task not started, a failed attempt under its gang's failure policy (by default another, up to
# retry.max_attempts), never "will not be retried unchanged". So on a host whose nsswitch.conf names a source that
# never runs, an unknown user fails its job only once its attempts are spent, with the error of that source in its
# message.


def _lookup_failed(fn: str, key: str | int, code: int) -> LookupFailed:
    what = f"user {key!r}" if fn == "getpwnam_r" else f"{nss.KEYS[fn]} {key}"
    return LookupFailed(f"task.user: cannot look up {what} on this host: {os.strerror(code)} (the user database "
                        "did not answer: the task was not started, and may be tried again)")


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
        code = nss_error("getpwnam_r", user)
        if code:
            raise _lookup_failed("getpwnam_r", user, code) from None
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
    for lookup, what, fn in ((pwd.getpwuid, "user", "getpwuid_r"), (grp.getgrgid, "group", "getgrgid_r")):
        try:
            name = lookup(uid)[0]
        except KeyError:
            code = nss_error(fn, uid)
            if code:  # an account may have it, the database unread: not let through
                raise _lookup_failed(fn, uid, code) from None
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


@dataclass
class Ready:
    """A task whose sandbox is made and whose gate (with a cgroup) is open: what start_now() starts."""

    sandbox: str
    command: str
    env: dict[str, str]
    who: pwd.struct_passwd | None
    subreaper: bool
    cgroup: str
    gate: tuple[int, int] | None  # the pipe's (read, write) ends


def ready(task: dict[str, object], base_env: dict[str, str]) -> Ready | dict[str, object]:
    """Everything of a task's start but the spawn: a Ready, or its reply entry (an error)."""
    sandbox = str(task["sandbox"])
    try:
        who = run_as(str(task.get("user") or ""), bool(task.get("root_allowed")))
    except Refused as e:
        return {"error": str(e), "permanent": True}
    except LookupFailed as e:
        return {"error": str(e), "permanent": False}
    try:
        prepare(sandbox, dict(task.get("files") or {}), who)  # type: ignore[call-overload]
    except OSError as e:
        return {"error": f"cannot prepare the sandbox: {e}", "permanent": False}
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
            return {"error": f"cannot make the task's cgroup {cgroup}: {e.strerror}", "permanent": False}
        try:
            gate = os.pipe2(os.O_CLOEXEC)
        except OSError as e:  # (EMFILE, ENFILE) this task fails, not the spawner: its loop would end with it
            return {"error": f"cannot start the task: {e.strerror or e}", "permanent": False}
    return Ready(sandbox, str(task["command"]), env, who, subreaper, cgroup, gate)


def start_now(r: Ready) -> tuple[dict[str, object], int | None]:
    """Start a Ready task here (its own user's, or another's through setpriv): (its reply entry, its pidfd or
    None)."""
    try:
        if r.who is None:
            pid = spawn(r.sandbox, r.command, r.env, r.subreaper, r.gate[0] if r.gate else None)
        else:
            pid = spawn_as(r.sandbox, r.command, r.env, r.who, r.subreaper, r.gate[0] if r.gate else None)
    except (ValueError, OSError) as e:
        return not_started(r, e), None
    finally:
        if r.gate:
            os.close(r.gate[0])
    return started(r, pid)


def not_started(r: Ready, e: BaseException) -> dict[str, object]:
    """The reply entry of a Ready task that could not be started (its gate's read end is the caller's)."""
    if r.gate:
        os.close(r.gate[1])
    msg, permanent = describe(e)
    return {"error": msg, "permanent": permanent}


def started(r: Ready, pid: int) -> tuple[dict[str, object], int | None]:
    """The reply entry and pidfd of a Ready task started as `pid`; a gated one waits for `go` (_let_go)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already over and reaped: the daemon reads its exit file
        if r.gate:
            os.close(r.gate[1])
        return {"pid": pid, "pidfd": False}, None
    except OSError as e:  # (EMFILE) started, but no one could watch it: stopped, and the task not started
        return _unwatched(r, pid, None, e)
    if r.gate:
        try:
            _gated.append(Gated(os.dup(fd), pid, r.cgroup, r.gate[1], _GO))
        except OSError as e:
            return _unwatched(r, pid, fd, e)
    return {"pid": pid, "pidfd": True}, fd


def _unwatched(r: Ready, pid: int, pidfd: int | None, e: OSError) -> tuple[dict[str, object], None]:
    """A wrapper started whose pidfd could not be had (out of descriptors): its group is killed (it leads it; a
    gated one also ends at its closed gate having run nothing) and the task reported not started, transient. By
    its pidfd when there is one; else by its group's number, a group that a wrapper started a moment ago leads
    (its number is given to no other group before that wrapper has ended, which it does not by itself this soon)."""
    if pidfd is not None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.close(pidfd)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    return not_started(r, e), None


_GO = b"go\n"


@dataclass
class Gated:
    """A wrapper started and not let go yet."""

    pidfd: int
    pid: int
    cgroup: str
    gate: int  # the write end of its stdin
    go: bytes  # what lets it go: `go`, and for a warm wrapper (below) the script that makes it its task's
    refusal: bytes | None = None  # a warm wrapper's, when it cannot be moved (warm_refusal)


_gated: list[Gated] = []
# how long started wrappers wait for the daemon's `go` before they are let go without it (the daemon sends it once
# the launch's last spawner has replied: milliseconds, or a few hundred under a heavy load)
GO_WAIT_S = 2.0


def _let_go() -> None:
    """Move each gated wrapper into its cgroup, then let it run its command; one that cannot be moved gets no `go`
    and ends without running anything (its gate is closed). A wrapper that has ended meanwhile (killed at once) is
    not moved: its pid may be another process's by now (this process ignores SIGCHLD, so its children are reaped
    as they end; the check and the move are a few microseconds apart, as for any signal sent by pid)."""
    while _gated:
        g = _gated.pop(0)
        pidfd, pid, cgroup, gate = g.pidfd, g.pid, g.cgroup, g.gate
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
                # gone already: killed, its cgroup removed (ENODEV: removed while this moved the ones before)
                if e.errno not in (errno.ESRCH, errno.ENOENT, errno.ENODEV):
                    sys.stderr.write(f"peloton spawner: cannot move {pid} into {cgroup}: {e.strerror}\n")
                    if g.refusal is not None:  # a warm wrapper says it in the task's stderr, as a cold one does
                        with contextlib.suppress(OSError):
                            os.write(gate, g.refusal)
                continue
            with contextlib.suppress(OSError):  # EPIPE: it died meanwhile
                os.write(gate, g.go)  # whole: never more than the pipe holds (warm_script), into an empty pipe
        finally:
            os.close(gate)
            os.close(pidfd)


# ------------------------------------------------------------------------------------------------ warm wrappers
# A gated member's wrapper (it has a cgroup; not a child subreaper) may be one started ahead of its launch: a
# "warm" wrapper, a shell that waits at its gate with nothing of any task yet (an empty environment, /dev/null for
# its output, $0 WARM_MARK). Starting a wrapper (a process and an exec of /bin/sh) was most of a launch's spawn
# stage; a warm one is handed its task where that would be. On `go` it reads, after the line `go`, a script from
# its gate (warm_script: the task's environment exported, a `cd` into the sandbox, the logs opened, and an exec of
# the task's own wrapper, ungated, with the arguments a launch gives it), so that from its exec on it is exactly
# the wrapper a cold start would have run: the same command line (is_wrapper), environment, umask, files. Until
# then it has run nothing of the task, and a gate closed without `go` ends it (125) as it ends a cold one.
# Each spawner keeps a pool per user and sandboxes directory (the wrappers wait in that directory, entered as root
# or by the user's launcher, so that the `cd` needs no permission above it), as many as the most of that user's
# members a request of the spawner had (at most _WARM_MAX, the daemon's --warm-wrappers; 0: none; all its pools
# together at most WARM_POOLS_MAX times that, the least recently used dropped beyond), refilled between requests
# (never while a launch waits for its `go`), dropped after WARM_IDLE_S without a request of that user. A task that does not fit a warm one (a name the shell cannot export, a script larger than the gate's pipe
# holds) starts cold, as does every task while its pool is empty.
WARM_MARK = "peloton-task-warm"
# Another user's warm wrapper waits outside any task's cgroup (in its spawner's) for up to WARM_IDLE_S, so the
# user's processes must not be able to take it over (ptrace it, read its memory, open its /proc/PID/fd) and run
# something there, free of every task's limits and kill. Such access needs the process to be dumpable, and a process
# that executes a file it may not read is not (as the launcher is not, having changed its uid): it executes
# WARM_SHELL, a copy of SHELL beside the sandboxes directory, root's and execute-only (0111). At `go` it executes
# the task's wrapper by SHELL, and from then on it is what a cold start runs, dumpable as the task's wrapper is.
WARM_SHELL = "warm-sh"
WRAPPER_WARM = """read -r gate && [ "$gate" = go ] || exit 125
. /dev/stdin
exit 125
"""
WARM_IDLE_S = LAUNCHER_IDLE_S
WARM_REFILL_BATCH = 4  # started between two looks at the daemon's socket (a request waits for at most these)
WARM_POOLS_MAX = 4  # all the pools of a spawner keep at most this many times _WARM_MAX (tenants' uids: a pool each)
_WARM_MAX: list[int] = []  # main(): the most kept a pool (the spawner's argument; none without it)
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOT_EXPORTABLE = frozenset({"OPTIND"})  # dash refuses a value it cannot parse (a cold wrapper fails the same way)
WarmKey = tuple[Key | None, str]  # the user (None: this process's own) and the directory its wrappers wait in


@dataclass
class Warm:
    pid: int
    pidfd: int
    gate: int  # the write end of its stdin
    room: int  # bytes its gate's pipe holds (F_GETPIPE_SZ)


@dataclass
class Pool:
    want: int  # how many it keeps
    used: float  # when a request last had a member for it
    wrappers: list[Warm] = field(default_factory=list)


_pools: dict[WarmKey, Pool] = {}  # in order of use, the latest last


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def warm_key(r: Ready, launcher: Key | None) -> WarmKey | None:
    """The pool a Ready task may take its wrapper from (`launcher`: its launcher_key); None: it starts cold (no
    gate, a child subreaper, or a user whose launcher failed lately)."""
    if not _WARM_MAX or not _WARM_MAX[0] or r.gate is None or r.subreaper:
        return None
    where = os.path.dirname(r.sandbox)
    if r.who is None:
        return None, where
    return None if launcher is None or not _may_search(where, launcher) else (launcher, where)


def _may_search(where: str, key: Key) -> bool:
    """The user `key` may look up a name in the directory `where` (x for its owner, group or others, as the mode
    says: the warm wrapper's `cd` into its sandbox; the local backend makes its sandboxes directory 0711 when tasks
    run as other users). By the mode alone: an ACL that grants more is not looked at (the task starts cold)."""
    try:
        st = os.stat(where)
    except OSError:
        return False
    uid, gid, groups = key
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == gid or st.st_gid in groups:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def warm_script(r: Ready) -> bytes | None:
    """What `go` writes into a warm wrapper's gate for `r` (after the line `go`), or None: `r` starts cold (a
    variable's name the shell cannot export; a NUL or an unencodable character, which a cold start refuses)."""
    if any(not _SHELL_NAME.fullmatch(k) or k in _NOT_EXPORTABLE or "\0" in v for k, v in r.env.items()):
        return None
    args = _args(".", r.command, r.env, False, False, absolute=r.sandbox)
    if any("\0" in a for a in args):
        return None
    lines = [f"export {k}={_quote(v)}" for k, v in r.env.items()]
    lines += [*_enter(r.sandbox), "exec " + " ".join(_quote(a) for a in args)]
    try:
        return _GO + ("\n".join(lines) + "\n").encode()
    except UnicodeEncodeError:
        return None


def _enter(sandbox: str) -> list[str]:
    """A warm wrapper's lines that enter the sandbox and open its logs there, as the wrapper's user."""
    return [f"cd -P ./{_quote(os.path.basename(sandbox))} || exit 127",
            "umask 077",  # the logs are owner-only (the wrapper sets its own umask back for the command)
            "exec </dev/null >>stdout 2>>stderr"]


def warm_refusal(sandbox: str) -> bytes:
    """What a warm wrapper handed the task of `sandbox` is told when it cannot be moved into the task's cgroup: what
    the gate of a cold wrapper says then (in the task's stderr), and 125, having run nothing of the task."""
    return _GO + ("\n".join([*_enter(sandbox), f"echo {_quote(_NOT_MOVED)} >&2", "exit 125"]) + "\n").encode()


def take_warm(r: Ready, key: WarmKey) -> tuple[dict[str, object], int | None] | None:
    """Start `r` in a warm wrapper of its pool (its reply entry and pidfd, as started() gives), or None: none is
    there for it (it starts cold). The wrapper is `r`'s from here: it gets its script at `go` (_let_go)."""
    pool = _pools[key].wrappers if key in _pools else None
    if not pool:
        return None
    script = warm_script(r)
    if script is None:
        return None
    while pool:
        w = pool.pop()
        if select.select([w.pidfd], [], [], 0)[0]:  # it ended (killed by one of the user's processes)
            _close_warm(w)
            continue
        if len(script) > w.room:
            pool.append(w)
            return None
        assert r.gate is not None
        try:
            watch = os.dup(w.pidfd)
        except OSError:  # (EMFILE) not this one: it goes, and the task starts cold (which says why, if it fails)
            _close_warm(w)
            return None
        os.close(r.gate[0])
        os.close(r.gate[1])
        _gated.append(Gated(watch, w.pid, r.cgroup, w.gate, script, warm_refusal(r.sandbox)))
        return {"pid": w.pid, "pidfd": True, "warm": True}, w.pidfd
    return None


def _close_warm(w: Warm) -> None:
    """Close a warm wrapper's gate (it ends, 125, having run nothing) and our pidfd of it."""
    for fd in (w.gate, w.pidfd):
        with contextlib.suppress(OSError):
            os.close(fd)


def want_warm(counts: dict[WarmKey, int]) -> None:
    """A request had `counts` members for these pools: each keeps at least as many (up to _WARM_MAX), and all the
    pools together at most WARM_POOLS_MAX times that (many tenants: the least recently used pools are dropped, this
    request's first ones too when it alone had members of more users than that keeps)."""
    if not counts:
        return
    now = time.monotonic()
    for key, n in counts.items():
        pool = _pools.pop(key, None) or Pool(0, now)
        pool.want, pool.used = min(_WARM_MAX[0], max(n, pool.want)), now
        _pools[key] = pool  # (last: in order of use)
    while sum(p.want for p in _pools.values()) > WARM_POOLS_MAX * _WARM_MAX[0]:
        _drop_warm(next(iter(_pools)))


def drop_idle_warm(now: float) -> None:
    """Drop the pools of users with no member in a request for WARM_IDLE_S."""
    for key in [k for k, pool in _pools.items() if now - pool.used >= WARM_IDLE_S]:
        _drop_warm(key)


def _drop_warm(key: WarmKey) -> None:
    for w in _pools.pop(key).wrappers:
        _close_warm(w)


def warm_missing() -> WarmKey | None:
    """A pool that keeps fewer wrappers than it wants (None: all are full)."""
    return next((k for k, pool in _pools.items() if len(pool.wrappers) < pool.want), None)


def warm_shell(where: str) -> str | None:
    """The path, from `where` (a sandboxes directory), of the copy of SHELL that another user's warm wrappers
    execute (WARM_SHELL, above), made or brought up to date here; None: there is none, and that user's members
    start cold. Only in a directory of this process's user that no one else may write (else it could be
    replaced)."""
    parent = os.path.dirname(where)
    path = os.path.join(parent, WARM_SHELL)
    try:
        dst = os.stat(parent)
        if dst.st_uid != os.geteuid() or dst.st_mode & 0o022:
            return None
        src = os.stat(SHELL)
        try:
            st = os.lstat(path)
            if (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o111
                    and (st.st_size, st.st_mtime_ns) == (src.st_size, src.st_mtime_ns)):
                return os.path.join("..", WARM_SHELL)
        except FileNotFoundError:
            pass
        tmp = f"{path}.{os.getpid()}"
        with open(SHELL, "rb") as f:
            body = f.read()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
        try:
            os.write(fd, body)
            os.fchmod(fd, 0o111)
            os.utime(fd, ns=(src.st_atime_ns, src.st_mtime_ns))  # what tells a copy of this SHELL (above)
        finally:
            os.close(fd)
        os.rename(tmp, path)  # whole or not at all (another spawner's copy, the same, may replace it)
        return os.path.join("..", WARM_SHELL)
    except OSError:
        return None


def refill_warm(key: WarmKey) -> None:
    """Start up to WARM_REFILL_BATCH warm wrappers into `key`'s pool: this process's own user's here, another's
    by its launcher, in one request (executing warm_shell's copy of SHELL). A pool that cannot be filled wants no
    more than it has (cold starts say why, if anything is wrong)."""
    pool = _pools[key].wrappers
    n = min(WARM_REFILL_BATCH, _pools[key].want - len(pool))
    user, where = key
    shell = SHELL if user is None else warm_shell(where)
    if shell is None:
        _pools[key].want = len(pool)
        return
    args = [shell, "-c", WRAPPER_WARM, WARM_MARK]
    gates: list[tuple[int, int]] = []
    pids: list[int | None] = []
    try:
        for _ in range(n):  # one by one: those made before a pipe2 that fails (EMFILE) are closed below
            gates.append(os.pipe2(os.O_CLOEXEC))
        if user is None:
            back = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.chdir(where)  # inherited by the wrappers (this process has one thread)
                for rd, _ in gates:
                    pids.append(os.posix_spawn(
                        SHELL, args, {},
                        file_actions=[(os.POSIX_SPAWN_DUP2, rd, 0),
                                      (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                      (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)],
                        setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=()))
            finally:
                os.fchdir(back)
                os.close(back)
        else:
            for rd, _ in gates:  # its `. /dev/stdin` opens the pipe again, as the user: readable by the user's
                # gid, nothing more, and still root's. Owned by the user, any of its processes could open the
                # wrapper's /proc/PID/fd/0 for writing (or chmod it so) and have it run a script of its own outside
                # any task's cgroup, or fill the pipe so that the write at `go` blocks this process for good
                os.fchown(rd, -1, user[1])
                os.fchmod(rd, 0o040)
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            cwd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                replies = _ask_launcher(user, [{"args": args, "env": {}, "group": None, "path": shell}] * n,
                                        [fd for rd, _ in gates for fd in (rd, null, null, cwd)]) or []
            finally:
                os.close(null)
                os.close(cwd)
            pids = [int(r["pid"]) if "pid" in r else None for r in replies]  # type: ignore[call-overload]
    except OSError:
        pass
    for i, (rd, wr) in enumerate(gates):
        os.close(rd)
        pid = pids[i] if i < len(pids) else None
        if pid is None:
            os.close(wr)
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # ended already
            os.close(wr)
            continue
        pool.append(Warm(pid, pidfd, wr, fcntl.fcntl(wr, fcntl.F_GETPIPE_SZ)))
    if len(pids) < n or None in pids:
        _pools[key].want = len(pool)


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
        if _gated and not select.select([sock], [], [], GO_WAIT_S)[0]:
            _let_go()  # no `go` in time (a daemon thread stuck, a daemon of another release): they run anyway
        if _pools:
            drop_idle_warm(time.monotonic())
        # the warm pools refill between requests, a few wrappers at a time, not while a launch waits for its `go`
        while not _gated and (missing := warm_missing()) is not None and not select.select([sock], [], [], 0)[0]:
            refill_warm(missing)
        while not _gated and (_launchers or _pools) and not select.select([sock], [], [], _idle_in())[0]:
            _close_idle_launchers()
            drop_idle_warm(time.monotonic())
        try:
            (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
            request = json.loads(_read_exact(sock, size))
        except (EOFError, ConnectionError):
            _let_go()  # the daemon went after the reply: what it was told started runs, as it was told
            return
        _let_go()  # `go` (every spawner of the launch has answered), or a request that came before it
        if "tasks" not in request:
            continue
        replies, fds = start_all(request["tasks"], base_env)
        body = json.dumps({"results": replies}).encode()
        frame = _HEADER.pack(len(body)) + body
        try:
            send_with_fds(sock, frame, fds)
        except (BrokenPipeError, ConnectionError):
            _let_go()  # the daemon went before the reply: what it may have journalled as started runs, as before
            return
        finally:
            for fd in fds:
                os.close(fd)
        # the wrappers are let go at the next frame: `go`, once every spawner of the launch has answered


SCM_MAX_FD = 253  # the most descriptors one message may pass (the kernel's limit: more is EINVAL)


def send_with_fds(sock: socket.socket, frame: bytes, fds: list[int]) -> None:
    """`frame`, with `fds` passed along it in order: SCM_MAX_FD a message at most, each with a byte of the frame
    (a started member's reply entry is tens of bytes: there are always enough), the rest of the frame after. The
    daemon's recvmsg stops at each message that carries descriptors (the kernel's rule for a stream socket) and
    collects them in order (spawn.py)."""
    view = memoryview(frame)
    chunks = [fds[i:i + SCM_MAX_FD] for i in range(0, len(fds), SCM_MAX_FD)]
    for n, chunk in enumerate(chunks):
        part = view if n == len(chunks) - 1 else view[:1]  # (the last chunk takes the rest of the frame along)
        sent = sock.sendmsg([part], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _ints(chunk))])
        view = view[sent:]
    if view:
        sock.sendall(view)


def start_all(tasks: list[dict[str, object]], base_env: dict[str, str]) -> tuple[list[dict[str, object]], list[int]]:
    """Start a request's tasks in order: a reply entry each, and the pidfds of those started. A task that cannot
    start makes the rest of its group (its gang) skipped; one of no group ends the request (no entry after it).
    Consecutive tasks for one user's launcher go to it in one request (launch_all), with the same rule there."""
    replies: list[dict[str, object]] = []
    fds: list[int] = []
    failed: set[object] = set()  # the groups (gangs) with a task that could not start: the rest of each is skipped
    ended = False
    batch: list[tuple[Ready, object]] = []
    key: Key | None = None

    def take(results: list[tuple[dict[str, object], int | None]], groups: list[object]) -> None:
        nonlocal ended
        for (entry, fd), group in zip(results, groups, strict=True):
            if ended:
                continue  # after a failure of a task of no group: none of these started (skipped), none is told
            replies.append(entry)
            if fd is not None:
                fds.append(fd)
            if "error" in entry:
                if group is None:
                    ended = True
                else:
                    failed.add(group)

    def flush() -> None:
        nonlocal batch, key
        if batch:
            assert key is not None
            take(launch_all(key, batch), [g for _, g in batch])
            batch, key = [], None

    counts: dict[WarmKey, int] = {}  # the members each warm pool was asked for (want_warm)
    for task in tasks:
        group = task.get("group")
        if group in failed:
            replies.append({"skipped": True})
            continue
        r = ready(task, base_env)
        k = launcher_key(r) if isinstance(r, Ready) else None
        wk = warm_key(r, k) if isinstance(r, Ready) else None
        if wk is not None:
            counts[wk] = counts.get(wk, 0) + 1
        if (isinstance(r, Ready) and k is not None and batch and k == key and len(batch) < LAUNCH_BATCH_MAX
                and not (wk is not None and wk in _pools and _pools[wk].wrappers)):
            batch.append((r, group))
            continue
        flush()  # what this task may depend on (an earlier failure of its group) is known after it
        if ended or group in failed:
            if isinstance(r, Ready):
                for end in r.gate or ():
                    os.close(end)
            if ended:
                break
            replies.append({"skipped": True})
            continue
        if isinstance(r, Ready) and wk is not None:
            got = take_warm(r, wk)
            if got is not None:
                take([got], [group])
                continue
        if isinstance(r, Ready) and k is not None:
            batch, key = [(r, group)], k
            continue
        take([(r, None) if isinstance(r, dict) else start_now(r)], [group])
        if ended:
            break
    flush()
    want_warm(counts)
    return replies, fds


FD_LIMIT_MAX = 1 << 20


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft limit of open descriptors to its hard limit (at most FD_LIMIT_MAX), for the
    daemon and the spawners it starts: both hold descriptors per running or starting member (a pidfd each, a gate),
    and a soft limit of 1024 (a daemon started by hand; the systemd unit gives 1048576) failed a gang of a few hundred
    members, its spawner out of descriptors (each such member fails, transient: nss_error, _unwatched). (the soft
    limit before, after)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT_MAX if hard == resource.RLIM_INFINITY else min(hard, FD_LIMIT_MAX)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError):
            return soft, soft
        return soft, want
    return soft, soft


def _ints(fds: list[int]) -> bytes:
    return struct.pack(f"{len(fds)}i", *fds)


def main() -> int:
    # Children are reaped by the kernel (the daemon learns of their end through the pidfds and the exit files).
    # SIGINT stays at its default, for the tasks started by fork to inherit: the spawner is in a session of its
    # own (spawn.py), so Ctrl-C at the daemon's terminal never reaches it.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _UMASK.append(current_umask())  # what every wrapper gives its command (wrapper_of)
    _LAUNCHERS_ON.append(True)  # one thread here: a user's launcher may be forked (Launcher)
    _load_libc()  # (3 ms) so that a user lookup that failed can tell why, even out of descriptors (nss_error)
    _WARM_MAX.append(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
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
