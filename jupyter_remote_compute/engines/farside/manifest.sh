#!/bin/sh
# manifest.sh [--direct BYTES] [--no-tracking] DIR NAME OUTPUT...: the declared outputs of the job in
# DIR (paths under work/) and its mlruns/ (not with --no-tracking: a checkpoint set's files only), as
# tar on stdout, the far disk read once and hashed as it streams:
#   entry NAME, first:       M <index>          output <index> does not exist
#                            T <kilobytes>      the size of everything that follows
#                            D <size> <octal mode> <base64 path>  with --direct: a regular file
#                                               of at least BYTES left out, for the reader to
#                                               fetch by itself
#   the outputs, mlruns/
#   entry NAME.sums, last:   <sha256>  <path>   every regular file sent (sha256sum's format, its
#                                               escaping included)
# The digests come after the files because they are computed while the files stream: the reader
# takes the stream as concatenated archives (zero blocks between entries are skipped, as tar -i
# does) and a stream without NAME.sums as cut short. Nothing is followed through a link: a link
# inside an output is sent as a link, for this side to refuse.
#
# python3, where the machine has it, writes the tar itself, hashing each file in the pass that
# sends it (OpenSSL's sha256, several times coreutils' speed). Without it, tar sends while
# sha256sum (or shasum) reads the same files beside it (the page cache serves the second reader);
# --direct is then ignored (every file is sent).
direct=0
tracking=1
if [ "$1" = --direct ]; then direct=$2; shift 2; fi
if [ "$1" = --no-tracking ]; then tracking=0; shift; fi
cd -- "$1" || { echo "job directory $1 is missing" >&2; exit 3; }
m=$2
shift 2
trap 'rm -f -- "$m" "$m.sums"' EXIT

# The one-pass writer. Exit 97 before writing anything means "not usable here": sh takes over.
# Kept to Python 3.5's syntax (a far machine's python3 may be old); no single quote inside.
prog='
import hashlib, os, stat, sys
try:
    import tarfile
except ImportError:
    sys.exit(97)
import base64
direct, tracking, name, outputs = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], sys.argv[4:]
CHUNK = 1 << 20

def put(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
head = []
roots = []
for i, o in enumerate(outputs):
    if os.path.lexists("work/" + o):
        roots.append("work/" + o)
    else:
        head.append("M %d" % i)
if tracking and os.path.isdir("mlruns"):
    roots.append("mlruns")
entries = []
stack = list(reversed(roots))
try:
    while stack:
        p = stack.pop()
        st = os.lstat(p)
        if stat.S_ISSOCK(st.st_mode):
            continue  # as tar does: a socket is no content
        entries.append((p, st))
        if stat.S_ISDIR(st.st_mode):
            stack.extend(p + "/" + n for n in sorted(os.listdir(p), reverse=True))
except OSError as e:
    sys.stderr.write("cannot list the outputs: %s\n" % e)
    sys.exit(3)
total = sum(st.st_size for _, st in entries if stat.S_ISREG(st.st_mode))
head.append("T %d" % ((total + 1023) // 1024))
if direct:
    for p, st in entries:
        if stat.S_ISREG(st.st_mode) and st.st_size >= direct:
            head.append("D %d %o %s" % (st.st_size, st.st_mode & 0o7777, base64.b64encode(os.fsencode(p)).decode()))

USTAR_TAIL = b"ustar\x0000" + b"\0" * 247

def header(path, kind, size=0, mode=0o644, mtime=0, link=""):
    mode, mtime = mode & 0o7777, int(mtime)
    raw, rawlink = os.fsencode(path), os.fsencode(link)
    if len(raw) <= 100 and len(rawlink) <= 100 and max(raw + rawlink + b"\0") < 128 and size < 8 ** 11 and 0 <= mtime < 8 ** 11:
        # the common case built directly (tarfile takes ten times as long for the same block)
        block = (raw.ljust(100, b"\0") + b"%07o\x000000000\x000000000\x00%011o\x00%011o\x00" % (mode, size, mtime)
                 + b"        " + kind + rawlink.ljust(100, b"\0") + USTAR_TAIL)
        return block[:148] + b"%06o\x00" % sum(block) + block[155:]
    info = tarfile.TarInfo(path)
    info.type, info.size, info.mode, info.mtime, info.linkname = kind, size, mode, mtime, link
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")

def pad(n):
    return b"\0" * (-n % 512)

pending = bytearray()

def emit(data):
    # headers and small files gather into big writes
    pending.extend(data)
    if len(pending) >= CHUNK:
        flush()

def flush():
    put(pending)
    del pending[:]

def blob(path, data):
    emit(header(path, tarfile.REGTYPE, len(data), 0o600) + data + pad(len(data)))

def sum_line(digest, path):
    raw = os.fsencode(path)
    if b"\\" in raw or b"\n" in raw or b"\r" in raw:
        raw = raw.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
        return b"\\" + digest.encode() + b"  " + raw + b"\n"
    return digest.encode() + b"  " + raw + b"\n"

def shrank(p):
    sys.stderr.write("output %r shrank while it was being fetched\n" % p)
    sys.exit(3)

blob(name, ("\n".join(head) + "\n").encode())
sums = []
first_name = {}
buf = bytearray(CHUNK)
view = memoryview(buf)
for p, st in entries:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        emit(header(p, tarfile.DIRTYPE, mode=mode, mtime=st.st_mtime))
    elif stat.S_ISLNK(mode):
        emit(header(p, tarfile.SYMTYPE, mtime=st.st_mtime, link=os.readlink(p)))
    elif stat.S_ISREG(mode) and direct and st.st_size >= direct:
        continue  # listed in the first entry: the reader fetches it by itself
    elif stat.S_ISREG(mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in first_name:
            # a second name of a file already sent: a tar hard link, as tar writes it
            target, digest = first_name[key]
            emit(header(p, tarfile.LNKTYPE, mode=mode, mtime=st.st_mtime, link=target))
            sums.append(sum_line(digest, p))
            continue
        h = hashlib.sha256()
        size = left = st.st_size
        try:
            f = open(p, "rb", buffering=0)
        except OSError as e:
            sys.stderr.write("cannot read output %r: %s\n" % (p, e.strerror))
            sys.exit(3)
        with f:
            emit(header(p, tarfile.REGTYPE, size, mode, st.st_mtime))
            if size < CHUNK:
                data = f.read(size)
                if len(data) < size:
                    shrank(p)
                h.update(data)
                emit(data + pad(size))
                left = 0
            else:
                flush()
            while left:
                n = f.readinto(view[: min(CHUNK, left)])
                if not n:
                    shrank(p)
                h.update(view[:n])
                put(view[:n])
                left -= n
        if size >= CHUNK:
            emit(pad(size))
        digest = h.hexdigest()
        first_name[key] = (p, digest)
        sums.append(sum_line(digest, p))
    else:
        kind = tarfile.FIFOTYPE if stat.S_ISFIFO(mode) else tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        emit(header(p, kind, mode=mode, mtime=st.st_mtime))
blob(name + ".sums", b"".join(sums))
emit(b"\0" * 1024)
flush()
'
if command -v python3 >/dev/null 2>&1; then
  # -S -E: the writer needs only the standard library; a site-packages with many .pth files (conda,
  # pyenv) costs more to start than small outputs take to pack.
  python3 -S -E -c "$prog" "$direct" "$tracking" "$m" "$@"
  code=$?
  [ "$code" -eq 97 ] || exit "$code"
fi

command -v tar >/dev/null 2>&1 || { echo "tar is not installed on this machine: install it" >&2; exit 3; }
if command -v sha256sum >/dev/null 2>&1; then hasher="sha256sum --"; else hasher="shasum -a 256 --"; fi
: > "$m"
: > "$m.sums"
i=0
n=$#
while [ $i -lt "$n" ]; do
  p="work/$1"
  shift
  if [ -e "$p" ] || [ -h "$p" ]; then set -- "$@" "$p"; else echo "M $i" >> "$m"; fi
  i=$((i+1))
done
if [ "$tracking" = 1 ] && [ -d mlruns ]; then set -- "$@" mlruns; fi
hashing=
if [ $# -gt 0 ]; then
  du -sk -- "$@" | { t=0; while read -r k _; do case $k in ''|*[!0-9]*) ;; *) t=$((t+k)) ;; esac; done; echo "T $t" >> "$m"; }
  find "$@" -type f -exec $hasher {} + > "$m.sums" &
  hashing=$!
fi
tar -cf - "$m" "$@" || exit
if [ -n "$hashing" ]; then
  wait "$hashing" || { echo "hashing the outputs failed" >&2; exit 3; }
fi
tar -cf - "$m.sums"
