# Where an O_APPEND file's data lands (tests/volume/data_path.rs, tests/multihost).
# Usage: python3 append_probe.py DIR [BEHIND|-] [nomap]
# BEHIND: DIR reached around the mount (natively DIR itself); "nomap": no shared writable
# mapping (an agent's write handle on a multi-host volume may have none).
import fcntl, mmap, os, sys

d = sys.argv[1]
behind = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
nomap = len(sys.argv) > 3 and sys.argv[3] == "nomap"
A = os.O_APPEND


def content(name):
    with open(os.path.join(behind or d, name), "rb") as f:
        return f.read().decode()


if not nomap:
    # A store into a shared mapping of a file opened O_APPEND, written back by msync.
    fd = os.open(os.path.join(d, "mapped"), os.O_RDWR | os.O_CREAT | os.O_TRUNC | A, 0o644)
    os.write(fd, b"0123456789")
    m = mmap.mmap(fd, 10)
    m[0:1] = b"X"
    m.flush()
    m.close()
    os.close(fd)
    print("mapped", content("mapped"))

# Two descriptors appending in turn; pwrite on an O_APPEND descriptor appends too.
p = os.path.join(d, "log")
a = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | A, 0o644)
b = os.open(p, os.O_WRONLY | A)
os.write(a, b"a"); os.write(b, b"bb"); os.pwrite(a, b"c", 0); os.write(b, b"d")
print("appends", content("log"), os.lseek(b, 0, os.SEEK_CUR))
# O_APPEND taken off and put back with fcntl: the flags of each write count.
fl = fcntl.fcntl(a, fcntl.F_GETFL)
fcntl.fcntl(a, fcntl.F_SETFL, fl & ~A)
os.pwrite(a, b"Z", 0)
fcntl.fcntl(a, fcntl.F_SETFL, fl)
os.write(a, b"e")
print("fcntl", content("log"))
os.close(a); os.close(b)

if not nomap:
    # A mapping through a read-write descriptor while another appends.
    p = os.path.join(d, "both")
    w = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    ap = os.open(p, os.O_WRONLY | A)
    os.write(w, b"abcdefgh")
    m = mmap.mmap(w, 8)
    m[7:8] = b"H"
    os.write(ap, b"++")
    m.flush(); m.close()
    print("both", content("both"))
    os.close(w); os.close(ap)

if behind:
    # The file grows behind the kernel's back; the next append goes after that growth.
    p = os.path.join(d, "grown")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | A, 0o644)
    os.write(fd, b"0123456789")
    os.fsync(fd)
    with open(os.path.join(behind, "grown"), "ab") as f:
        f.write(b"ABCDE")
    os.write(fd, b"x")
    os.close(fd)
    print("grown", content("grown"))
