#!/bin/sh
# facts.sh DIR [INDEX_URL [CA_BUNDLE]]: what this machine is, as name=value lines (gpu= once per GPU:
# "name, MiB"). DIR (or its nearest existing parent) is where free disk space is measured; INDEX_URL
# (the machine's index_url option) and CA_BUNDLE (its index_ca_bundle) are what builds install from
# and trust: the index= line says whether it is reached and its certificate trusted. tls.sh comes
# before this script (farside.script), as before env.sh.
printf 'os=%s\n' "$(uname -s)"
printf 'kernel=%s\n' "$(uname -r)"
printf 'arch=%s\n' "$(uname -m)"
if [ -r /etc/os-release ]; then
  printf 'distro=%s\n' "$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"')"
fi
printf 'python=%s\n' "$( (python3 --version || python --version) 2>&1 | head -n 1)"
printf 'cpus=%s\n' "$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null)"
if [ -r /proc/meminfo ]; then
  printf 'mem_kb=%s\n' "$(sed -n 's/^MemTotal: *\([0-9]*\).*/\1/p' /proc/meminfo)"
else
  printf 'mem_b=%s\n' "$(sysctl -n hw.memsize 2>/dev/null)"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu=/'
fi
d=${1:-.}
while [ ! -d "$d" ]; do d=$(dirname -- "$d"); done
printf 'disk_kb=%s\n' "$(df -Pk -- "$d" | tail -n 1 | awk '{print $4}')"
# container=<runtime> <version> <rootless|rootful>, once per container runtime installed (environments/image.py;
# apptainer and singularity are named so a refusal can say the machine has one jobs do not run in yet)
for rt in podman docker apptainer singularity; do
  command -v "$rt" >/dev/null 2>&1 || continue
  v=$("$rt" --version 2>/dev/null | sed -n 's/.*[Vv]ersion \([^ ,]*\).*/\1/p')
  if [ "$rt" != docker ] && [ "$(id -u)" != 0 ]; then m=rootless; else m=rootful; fi
  printf 'container=%s %s %s\n' "$rt" "${v:-unknown}" "$m"
  # container_nvidia=<runtime> yes|no: whether it can give a container NVIDIA GPUs (docker: the nvidia
  # runtime registered; podman: a CDI spec naming nvidia.com/gpu). No line: not known (no daemon).
  case $rt in
    docker)
      # A daemon that does not answer in 10 s leaves it unknown rather than holding up the check.
      if runtimes=$(if command -v timeout >/dev/null 2>&1; then timeout 10 docker info --format '{{json .Runtimes}}'
                    else docker info --format '{{json .Runtimes}}'; fi 2>/dev/null); then
        case $runtimes in *'"nvidia"'*) nv=yes ;; *) nv=no ;; esac
        printf 'container_nvidia=docker %s\n' "$nv"
      fi ;;
    podman)
      if grep -qs 'nvidia.com/gpu' /etc/cdi/* /var/run/cdi/*; then nv=yes; else nv=no; fi
      printf 'container_nvidia=podman %s\n' "$nv" ;;
  esac
done
# uv=<version> when a uv that runs is on PATH: env.sh builds with it, so none is sent (environments/environment.py)
if command -v uv >/dev/null 2>&1 && v=$(uv --version 2>/dev/null); then
  printf 'uv=%s\n' "$(printf '%s' "$v" | cut -d' ' -f2)"
fi
# index=trusted | untrusted (why) | unreachable (why): one HEAD request to the package index builds
# install from (the option, else the installer's settings here, else PyPI's), 10 s at most, with the
# trust the build has (tls.sh). No python3: not measured.
rc_tls "${3-}"
url=${2:-${UV_DEFAULT_INDEX:-${UV_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple/}}}}
if command -v python3 >/dev/null 2>&1; then
  python3 - "$url" <<'PY' 2>/dev/null || printf 'index=unreachable (the check could not run)\n'
import ssl, sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=10)
    print("index=trusted")
except urllib.error.HTTPError:
    print("index=trusted")  # an answer: the certificate held
except (urllib.error.URLError, OSError) as e:
    why = getattr(e, "reason", e)
    if isinstance(why, ssl.SSLCertVerificationError):
        print(f"index=untrusted (certificate verify failed: {why.verify_message})")
    else:
        print(f"index=unreachable ({why})".replace(chr(10), " "))
PY
fi
