"""Every limit on what a caller may send, in one place. The validator owns them; the rest of the daemon relies on them.

Why these numbers:

- Strings that land in a store column (job name, owner, pool path, job id) are counted in characters, as
  PostgreSQL's varchar(n) counts them, and each limit is at most its column's length (peloton/store/models.py),
  so SQLite (which enforces no length) and PostgreSQL (which does) give the same answer: the validator's.
- Strings that reach the kernel at launch (the command, the environment) are counted in UTF-8 bytes. Linux
  refuses an exec whose single argv/env string is over MAX_ARG_STRLEN (131072 bytes with its NUL) or whose
  strings together are over ARG_MAX (2 MiB with the usual 8 MiB stack) with "Argument list too long". A task's
  environment is the daemon's own, plus `task.env`, plus the training variables (PELOTON_PEERS alone is up to
  ~22 bytes a member of the gang); the limits below keep the caller's part to a quarter of ARG_MAX, and each
  string to half of MAX_ARG_STRLEN.
- No string anywhere may hold a NUL character: a C string (argv, env) ends at the first NUL, and PostgreSQL
  rejects NUL in text.
- Numbers must be finite, and positive quantities no smaller than a granularity: a denormal cpu (5e-324) once
  overflowed the placer (1 / cpu is infinite).
- Durations are protobuf Durations: seconds within +-315576000000 and nanos within +-999999999 of the same
  sign (checked before any conversion), then within the documented range.

docs/job-spec.md ("Limits") lists every one of these; keep the two in step.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# --- strings: characters (store columns) --------------------------------------------------------------------------
MAX_JOB_NAME_CHARS = 200  # jobs.name is varchar(256)
MAX_OWNER_CHARS = 256  # jobs.owner is varchar(256)
MAX_POOL_PATH_CHARS = 512  # resource_pools.path and jobs.respool are varchar(512)
MAX_POOL_SEGMENT_CHARS = 128  # one name between slashes in a pool path
MAX_PRINCIPAL_CHARS = 128  # a principal's name (audit_events.principal is varchar(128))
MAX_POOL_SUBMITTERS = 1000  # principals in one pool's access list
MAX_JOB_ID_CHARS = 128  # jobs.id is varchar(128); the daemon's ids are 12 hex characters
DAEMON_JOB_ID_CHARS = 12  # (jobmgr/manager.py: uuid4().hex[:12]); ListJobs' id_prefix is at most this long
MAX_REQUEST_ID_CHARS = 128  # CreateJobRequest.request_id (jobs.request_id is String(128))
MAX_CONTAINER_IMAGE_CHARS = 1024
MAX_USER_CHARS = 32  # a task's user name (useradd's limit on Linux)
MAX_CONSTRAINT_ATTRIBUTE_CHARS = 256
MAX_CONSTRAINT_VALUE_CHARS = 1024  # `in` takes a comma-separated list
MAX_ENV_NAME_CHARS = 256  # names are ASCII ([A-Za-z_][A-Za-z0-9_]*): characters are bytes
MAX_NAME_CONTAINS_CHARS = MAX_JOB_NAME_CHARS  # ListJobs name filter: longer can match no job

# --- strings: UTF-8 bytes (what reaches exec) ---------------------------------------------------------------------
MAX_COMMAND_BYTES = 64 * KiB  # one argv string of `/bin/sh -c COMMAND`
MAX_ENV_VALUE_BYTES = 64 * KiB  # one `NAME=value` string stays under MAX_ARG_STRLEN (128 KiB)
# command + NUL, and `NAME=value` + NUL for every task.env entry, together
MAX_COMMAND_AND_ENV_BYTES = 256 * KiB
# Every role's command, env (names and values), env_files (names and paths) and container image, together: each role
# is within the limits of one task, and this keeps the largest valid spec under MAX_SPEC_BYTES (16 roles each at the
# per-task limits would not be). A member's own environment is one role's, so exec's limits hold as for a task.
MAX_ROLES_TASK_BYTES = 512 * KiB

# --- counts -------------------------------------------------------------------------------------------------------
MAX_INSTANCES = 100_000
# Members of one gang (min_available, or instances when it is 0). Every member's environment lists every member
# (PELOTON_PEERS, `address:port,` ~22 bytes each with IPv4 addresses): 4096 members keep it near 90 KiB, under
# MAX_ARG_STRLEN. A larger job can be elastic: a gang of at most this many, then gangs of one. A job with roles also
# lists them in PELOTON_ROLE_HOSTS_<NAME> (as many bytes again, over all roles) and TF_CONFIG (`"address:port",`
# ~24 bytes a member): each string still under MAX_ARG_STRLEN, all three near 300 KiB, well under ARG_MAX.
MAX_GANG_SIZE = 4096
MAX_ATTEMPTS = 10_000  # retry.max_attempts
MAX_ENV_ENTRIES = 1024
MAX_ENV_FILES = 16  # task.env_files entries (each adds a line to the member's command)
MAX_ENV_FILE_PATH_CHARS = 1024
MAX_CONSTRAINTS = 64
MAX_ROLES = 16  # roles of one job (JobSpec.roles); their instances count against MAX_INSTANCES and MAX_GANG_SIZE
MAX_ROLE_NAME_CHARS = 63  # [a-z][a-z0-9-]*: also a variable name's suffix (PELOTON_ROLE_HOSTS_<NAME>)
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1  # sla.priority: any int32 (the store's Integer column)

# --- resources of one task (per member) ---------------------------------------------------------------------------
MIN_CPU = 0.001  # cores; cpu must be at least this (it must be > 0)
MAX_TASK_CPU = 4096.0  # cores
MIN_MEM_MIB = 1 / 1024  # 1 KiB: a positive mem or disk below this is refused (0 is fine)
MAX_TASK_MEM_MIB = 64.0 * 1024 * 1024  # 64Ti
MAX_TASK_DISK_MIB = 1024.0 * 1024 * 1024  # 1024Ti
MAX_TASK_GPU = 256
MAX_TASK_PORTS = 64

# --- resource pools (reservation and limit: totals over many tasks) ----------------------------------------------
MAX_POOL_CPU = 10_000_000.0  # cores
MAX_POOL_MEM_MIB = float(2**40)  # 1 EiB = 1048576Ti
MAX_POOL_DISK_MIB = float(2**40)
MAX_POOL_GPU = 1_000_000
MAX_POOL_PORTS = 100_000_000
MIN_POOL_SHARE = 0.001  # a share of 0 (or absent) in a request means the default, 1
MAX_POOL_SHARE = 1_000_000.0

# --- durations (seconds) ------------------------------------------------------------------------------------------
PROTO_DURATION_MAX_SECONDS = 315_576_000_000  # google.protobuf.Duration: +-10000 years
PROTO_DURATION_MAX_NANOS = 999_999_999
MAX_LAUNCH_TIMEOUT_S = 7 * 24 * 3600.0  # gang.launch_timeout: > 0 and at most 7 days
MAX_RUNTIME_S = 365 * 24 * 3600.0  # sla.max_runtime: >= 0 (0: none) and at most 365 days
MAX_DRAIN_DEADLINE_S = 30 * 24 * 3600.0  # host drain --deadline: at most 30 days
MAX_PREEMPTION_GRACE_S = 3600.0  # sla.preemption_grace: a preempted gang holds its hosts this long at most

# --- requests -----------------------------------------------------------------------------------------------------
DEFAULT_LIST_LIMIT = 100  # ListJobs.limit 0
MAX_LIST_LIMIT = 10_000  # ListJobs.limit
MAX_STATE_FILTERS = 32  # ListJobs.states entries
# CreateJob: the serialized JobSpec. Every other limit together stays well under it; it bounds the work done on
# a request before validation.
MAX_SPEC_BYTES = 1 * MiB
# Any request of the public API (every port: TCP, TLS, the Unix socket), as gRPC receives it: a bigger one is
# refused by gRPC itself with RESOURCE_EXHAUSTED before the daemon reads it. The largest request is a CreateJob,
# whose spec is at most MAX_SPEC_BYTES.
MAX_REQUEST_BYTES = 4 * MiB
# A spec file as `job create -f` and `job plan -f` read it (a file, a pipe, stdin): at most as much as the daemon
# receives in one request. Nothing larger can be sent, and a reader without a limit would take memory without end
# from /dev/zero or a pipe that never closes. Four times MAX_SPEC_BYTES: room for YAML's indentation, comments and
# quoting around a spec that serializes under it.
MAX_SPEC_FILE_BYTES = MAX_REQUEST_BYTES

# --- the operator's files, read whole at start (or, the principals file, when it changes) -------------------------
# Each read up to its limit and no further (files.read_bounded): a larger one, or one without end (/dev/zero, a pipe
# that never closes), is refused naming the file and the limit, before anything is started or written. Each is far
# above what a real file holds; the bound is there so that a wrong path cannot take the daemon's memory.
MAX_CONFIG_FILE_BYTES = 1 * MiB  # `peloton server --config` (TOML), and the CLI's config.toml (its contexts)
MAX_GPU_TABLE_BYTES = 1 * MiB  # `--gpu-table` (JSON: a row a GPU model, a few dozen bytes each)
MAX_PRINCIPALS_FILE_BYTES = 16 * MiB  # `--principals-file` (JSON: ~100 bytes a principal and a token hash)

# Model-aware plans (docs/model-aware.md)
MAX_MODEL_NAME_CHARS = 128  # a stored model's name
MAX_BATCH = 1e9  # model.local_bsz, model.global_bsz
