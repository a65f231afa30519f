# env.sh: the job's Python environment, made ready by the far side itself. Sourced (not run) by the
# job's command.sh, in <base>/[jobs/]<job id>/work, before the job's command, on every kind; so it leaves the
# environment's bin first on PATH (and VIRTUAL_ENV) for the command, or exits and fails the job.
# command.sh sets, before sourcing (environments/environment.py writes them):
#   rc_env_digest  the environment's content digest: <base>/envs/<digest>/ holds it
#   rc_env_spec    a folder holding what to install: requirements.txt | pyproject.toml [uv.lock] |
#                  pylock.toml | pinned.txt (a closed set: every distribution pinned), and
#                  packages.txt (one requirement a line)
#   rc_env_python  a Python version, or empty for the machine's python3
#   rc_env_index   a package index URL, or empty for the installer's default
#   rc_env_find_links  a folder or page of wheels beside the index, or empty
#   rc_env_ca_bundle   the machine's index_ca_bundle: the CA bundle the index is trusted with, or empty
#   rc_env_offline 1 for wheels: from_here: install only from the wheels sent in _remote_compute_wheels/
#   rc_env_uv      a uv binary this side knows of (the built-in machine), or empty
#   rc_env_days rc_env_max_bytes   eviction: unused for longer than this, or beyond this size together
# In a container image, container.sh gives JRC_IMAGE_DIGEST (the image's pinned id) and the job's
# command.sh mounts <base>/envs and <base>/tools at their own paths: the environment is built inside
# the image, with its Python, and named by both digests, <base>/envs/<digest>-<image id>, so two images
# never share one. Eviction is left to the jobs outside images, which see every job folder.
# An environment is built in place under a lock and marked `complete` last: a venv's scripts name
# their folder, so one built elsewhere and renamed would not run. A folder without the marker is
# never used: the next job holding the lock removes it and builds it again.
rc_env_jobdir=$(cd .. && pwd -P) || exit 96
rc_env_jobs=${rc_env_jobdir%/*}
# The machine's base: where the job folders are, or above them when they are in <base>/jobs (ssh).
case $rc_env_jobs in */jobs) rc_env_base=${rc_env_jobs%/jobs} ;; *) rc_env_base=$rc_env_jobs ;; esac
rc_env_job=${rc_env_jobdir##*/}
rc_env_root=$rc_env_base/envs
rc_env_name=$rc_env_digest
if [ -n "${JRC_IMAGE_DIGEST-}" ]; then
  rc_env_name=$rc_env_digest-$(printf '%s' "${JRC_IMAGE_DIGEST#sha256:}" | cut -c1-16)
  # the image's user may have no writable home for uv's cache; an environment is built once per image
  [ -n "${UV_NO_CACHE+x}" ] || { UV_NO_CACHE=1 rc_env_nocache=1; export UV_NO_CACHE; }
fi
rc_env_dir=$rc_env_root/$rc_env_name
rc_env_short=$(printf '%s' "$rc_env_digest" | cut -c1-12)
mkdir -p -- "$rc_env_root" || { echo "environment: cannot make $rc_env_root" >&2; exit 96; }

# A lock per name: flock where there is one (the kernel frees it when its holder dies); else a
# folder naming its holder, taken over once that process is gone from this host (or after an hour
# from another host's, on a shared file system).
rc_env_lock() { # NAME [nowait]
  rc_env_held=$rc_env_root/.lock-$1
  if command -v flock > /dev/null 2>&1; then
    exec 9> "$rc_env_held" || return 1
    if [ "${2-}" = nowait ]; then flock -n 9; else flock 9; fi
    return
  fi
  rc_env_held=$rc_env_held.d
  while ! mkdir -- "$rc_env_held" 2> /dev/null; do
    [ "${2-}" = nowait ] && return 1
    holder=$(cat -- "$rc_env_held/holder" 2> /dev/null)
    if { [ "${holder% *}" = "$(uname -n)" ] && ! kill -0 "${holder##* }" 2> /dev/null; } ||
      [ -n "$(find "$rc_env_held" -prune -mmin +60 2> /dev/null)" ]; then
      mv -- "$rc_env_held" "$rc_env_held.stale.$$" 2> /dev/null && rm -rf -- "$rc_env_held.stale.$$"
      continue
    fi
    sleep 0.2 2> /dev/null || sleep 1
  done
  printf '%s %s\n' "$(uname -n)" "$$" > "$rc_env_held/holder"
}
rc_env_unlock() {
  if [ -d "$rc_env_held" ]; then rm -rf -- "$rc_env_held"; else exec 9>&-; fi
}

# A uv this side sent (environments/environment.py tool_inputs) leaves the work tree at once for
# <base>/tools/uv-<its digest>, kept for the next jobs; the work tree's link goes. The work tree's
# file is a hard link to the input cache's entry (cache.sh), so tools/ takes another link to it, made
# executable and still read-only (0555): its bytes are stored once. A copy only where a link cannot
# be made (a container's separate mounts, a file system without links).
if [ -n "${rc_env_sent_uv-}" ] && [ -f _remote_compute_tools/uv ]; then
  rc_env_tool=$rc_env_base/tools/uv-$rc_env_sent_uv
  if [ ! -x "$rc_env_tool" ]; then
    mkdir -p -- "$rc_env_base/tools" &&
      { ln -f -- _remote_compute_tools/uv "$rc_env_tool.$$" 2> /dev/null ||
        cp -- _remote_compute_tools/uv "$rc_env_tool.$$"; } &&
      chmod 0555 -- "$rc_env_tool.$$" && mv -f -- "$rc_env_tool.$$" "$rc_env_tool"
  fi
  rm -rf -- _remote_compute_tools
fi

rc_env_find_uv() {
  for uv in "$(command -v uv 2> /dev/null)" "$rc_env_uv" "$rc_env_base/tools/uv-${rc_env_sent_uv-}"; do
    [ -n "$uv" ] && [ -x "$uv" ] && "$uv" --version > /dev/null 2>&1 && { printf '%s\n' "$uv"; return 0; }
  done
  return 1
}

# uv pip VERB ARGS... into the environment, its output into the log; uv says what the requirements
# resolved to ("Resolved N packages"): the count status.sh reports from then on.
rc_env_uv_pip() {
  { "$uv" pip "$@" --python "$rc_env_dir/bin/python" 2>&1
    echo "$?" > "$rc_env_dir/.install-rc"; } | while IFS= read -r line; do
    printf '%s\n' "$line"
    case $line in "Resolved "[0-9]*) printf 'uv %s\n' "$(echo "$line" | cut -d' ' -f2)" > "$rc_env_jobdir/env.state" ;; esac
  done
  read -r rc < "$rc_env_dir/.install-rc" 2> /dev/null || rc=1
  rm -f -- "$rc_env_dir/.install-rc"
  return "$rc"
}
rc_env_build() {
  rm -rf -- "$rc_env_dir"
  started=$(date +%s)
  req=
  for f in requirements.txt pyproject.toml pylock.toml pinned.txt; do [ -f "$rc_env_spec/$f" ] && req=$rc_env_spec/$f; done
  [ -s "$rc_env_spec/packages.txt" ] && pkgs=$rc_env_spec/packages.txt || pkgs=
  set --
  [ -n "$rc_env_find_links" ] && set -- --find-links "$rc_env_find_links"
  [ -n "$rc_env_offline" ] && set -- --no-index --find-links "$rc_env_jobdir/work/_remote_compute_wheels"
  # What status.sh reports while the build lasts: the tool and how many requirements were asked for,
  # then (uv) how many packages they resolved to.
  rc_env_count=$(cat -- ${req:+"$req"} ${pkgs:+"$pkgs"} < /dev/null 2> /dev/null | grep -cE '^[A-Za-z0-9]')
  case $req in *pylock.toml) rc_env_count=$(grep -c '^\[\[packages\]\]' "$req") ;; esac
  # The index's certificate is checked as the machine checks it (tls.sh): its CA bundle, its
  # SSL_CERT_FILE or pip's cert, and its system store rather than the public roots uv carries, unless
  # the job says which (UV_SYSTEM_CERTS, or UV_NATIVE_TLS as uv before 0.9 names it). A subshell:
  # none of it stays for the job's command.
  rc_tls "$rc_env_ca_bundle"
  if uv=$(rc_env_find_uv); then
    tool="uv $("$uv" --version | cut -d' ' -f2)"
    if [ -n "$rc_tls_system" ] && [ -z "${UV_SYSTEM_CERTS-}${UV_NATIVE_TLS-}" ]; then
      if "$uv" help 2> /dev/null | grep -q -- --system-certs; then
        UV_SYSTEM_CERTS=1 && export UV_SYSTEM_CERTS
      else
        UV_NATIVE_TLS=1 && export UV_NATIVE_TLS
      fi
    fi
    printf 'uv %s\n' "$rc_env_count" > "$rc_env_jobdir/env.state"
    echo "environment $rc_env_short: building with $tool"
    if [ -f "$rc_env_spec/uv.lock" ] && [ "${req##*/}" = pyproject.toml ]; then
      # The lock, not a fresh resolution: exactly the versions the project pinned.
      (cd -- "$rc_env_spec" && "$uv" export --frozen --no-emit-project --no-header -q -o locked.txt) || return
      req=$rc_env_spec/locked.txt
    fi
    "$uv" venv -q ${rc_env_python:+--python "$rc_env_python"} -- "$rc_env_dir" || return
    [ -n "$rc_env_offline" ] && set -- --offline "$@" || set -- ${rc_env_index:+--default-index "$rc_env_index"} "$@"
    if [ -n "$req$pkgs" ]; then
      # A lock is a whole set: sync installs it as it is, with no resolution (twice as fast for a
      # large set); packages on top are then resolved against it. A set that is not a lock is resolved.
      case ${req##*/} in
        pylock.toml | locked.txt | pinned.txt)
          echo "environment $rc_env_short: ${req##*/} is a closed set: synced as it is"
          rc_env_uv_pip sync "$@" "$req" || return
          [ -z "$pkgs" ] || rc_env_uv_pip install "$@" -r "$pkgs" || return ;;
        *) rc_env_uv_pip install "$@" ${req:+-r "$req"} ${pkgs:+-r "$pkgs"} || return ;;
      esac
    fi
    # pip in it, as in a venv python -m venv makes (the other branch): MLflow pins the pip a model is
    # logged with (its conda.yaml, python_env.yaml) and warns in every job that has none. From where
    # the packages came, else the interpreter's own copy (ensurepip, offline); neither: said, not fatal.
    if ! "$rc_env_dir/bin/python" -c 'import pip' > /dev/null 2>&1 &&
      ! "$uv" pip install -q --python "$rc_env_dir/bin/python" "$@" pip > /dev/null 2>&1 &&
      ! "$rc_env_dir/bin/python" -m ensurepip -q > /dev/null 2>&1; then
      echo "environment $rc_env_short: pip could not be added (not in the index, no ensurepip here): MLflow will not pin it"
    fi
    "$uv" pip freeze --python "$rc_env_dir/bin/python" > "$rc_env_dir/environment.txt" || return
  else
    py=python${rc_env_python:-3}
    tool="venv+pip (no uv on this machine)"
    printf 'pip %s\n' "$rc_env_count" > "$rc_env_jobdir/env.state"
    echo "environment $rc_env_short: building with $tool"
    case $req in *.toml) echo "environment: ${req##*/} needs uv, which this machine has not" >&2; return 2 ;; esac
    "$py" -m venv -- "$rc_env_dir" || return
    if [ -n "$req$pkgs" ]; then
      [ -n "$rc_env_offline" ] || set -- ${rc_env_index:+--index-url "$rc_env_index"} "$@"
      "$rc_env_dir/bin/python" -m pip install -q --disable-pip-version-check "$@" ${req:+-r "$req"} ${pkgs:+-r "$pkgs"} || return
    fi
    "$rc_env_dir/bin/python" -m pip freeze > "$rc_env_dir/environment.txt" || return
  fi
  seconds=$(($(date +%s) - started))
  python=$("$rc_env_dir/bin/python" -c 'import platform; print(platform.python_version())') || return
  printf 'tool=%s\npython=%s\nseconds=%s\n' "$tool" "$python" "$seconds" > "$rc_env_dir/info" || return
  du -sk -- "$rc_env_dir" | cut -f1 > "$rc_env_dir/size_kb" || return
  : > "$rc_env_dir/complete"
}

# An environment is in use while a job whose marker it holds has a folder and no exit code yet; the
# markers of jobs that ended are dropped on the way, so the list stays as long as the jobs running.
rc_env_in_use() { # DIR
  used=1
  for user in "$1"/.users/*; do
    [ -e "$user" ] || continue
    if [ -d "$rc_env_jobs/${user##*/}" ] && [ ! -f "$rc_env_jobs/${user##*/}/exit_code" ]; then
      used=0
    else
      rm -f -- "$user"
    fi
  done
  return $used
}

# Unused for the age, then least recently used first beyond the size; never one in use, never this one.
# Called holding the "use" lock, under which every job also marks the environment it takes.
rc_env_evict() {
  cd -- "$rc_env_root" || return 0
  total=0
  for d in $(ls -t -- */last-used 2> /dev/null); do
    d=${d%/last-used}
    kb=$(cat -- "$d/size_kb" 2> /dev/null || echo 0)
    if [ "$d" != "$rc_env_name" ] && ! rc_env_in_use "$d" &&
      { [ -n "$(find "$d/last-used" -mtime +"$rc_env_days" 2> /dev/null)" ] ||
        [ $(((total + kb) * 1024)) -gt "$rc_env_max_bytes" ]; }; then
      # renamed first, so no job takes a half-deleted folder for its environment
      mv -- "$d" ".gone-$d-$$" && rm -rf -- ".gone-$d-$$"
      continue
    fi
    total=$((total + kb))
  done
  cd -- "$rc_env_jobdir/work" || exit 96
}

while :; do
  rc_env_lock "$rc_env_name" || { echo "environment: cannot lock $rc_env_root" >&2; exit 96; }
  if [ -f "$rc_env_dir/complete" ]; then
    rc_env_how=cached
  elif (rc_env_build) 2>&1; rc_env_built=$?; rm -f -- "$rc_env_jobdir/env.state"; [ "$rc_env_built" = 0 ]; then
    rc_env_how="built in $(sed -n 's/^seconds=//p' "$rc_env_dir/info") s"
  else
    if [ -n "$rc_env_python" ] && ! [ -x "$rc_env_dir/bin/python" ]; then
      # no interpreter came of it: say which ones the machine has, on its PATH
      echo "environment: Python $rc_env_python was asked for; this machine has: $(
        IFS=:; for d in $PATH; do ls -- "$d" 2> /dev/null; done | grep -E '^python3(\.[0-9]+)?$' | sort -u | tr '\n' ' ')"
    fi
    echo "environment $rc_env_short: could not be built; the installer's message is above"
    rm -rf -- "$rc_env_dir"
    rc_env_unlock
    exit 95
  fi
  rc_env_unlock
  rc_env_lock use || { echo "environment: cannot lock $rc_env_root" >&2; exit 96; }
  if [ -f "$rc_env_dir/complete" ]; then
    # inside an image only this job's folder is mounted: another job's markers would look stale
    [ -n "${JRC_IMAGE_DIGEST-}" ] || rc_env_in_use "$rc_env_dir"
    mkdir -p -- "$rc_env_dir/.users" && : > "$rc_env_dir/.users/$rc_env_job" && touch -- "$rc_env_dir/last-used"
    [ -n "${JRC_IMAGE_DIGEST-}" ] || rc_env_evict
    rc_env_unlock
    break
  fi
  rc_env_unlock # evicted between the two locks: make it again
done
rm -rf -- _remote_compute_wheels # installed (or already there): the job's work tree does not keep them
echo "environment $rc_env_short: $rc_env_how ($(sed -n 's/^tool=//p' "$rc_env_dir/info"), Python $(sed -n 's/^python=//p' "$rc_env_dir/info"))"
# What the recorder puts on the MLflow run (recording/environment.py): which environment, what it holds.
echo "environment $rc_env_digest: installed $(tr '\n' ' ' < "$rc_env_dir/environment.txt")"
VIRTUAL_ENV=$rc_env_dir
PATH=$rc_env_dir/bin:$PATH
export VIRTUAL_ENV PATH
unset PYTHONHOME
[ -z "${rc_env_nocache-}" ] || unset UV_NO_CACHE
unset -f rc_env_lock rc_env_unlock rc_env_find_uv rc_env_uv_pip rc_env_build rc_env_in_use rc_env_evict rc_tls rc_tls_pip_cert
