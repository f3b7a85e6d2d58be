/* crashlog shim: record every durability-relevant call under one directory.
 *
 * LD_PRELOAD it with MEMFS_CRASHLOG=<log file> and MEMFS_CRASHLOG_DIR=<watched dir>. Each
 * call on a path under the watched dir (or an fd opened on one) appends one binary record
 * to the log: op, fd, inode, offset, length, two paths, and the bytes of a write. The
 * replayer (replay.py) rebuilds what a power cut at any record would leave on disk.
 *
 * A per-process mutex is held across the real call and its record, so the log order is
 * the order in which the calls took effect, even across the writer's threads.
 *
 * MEMFS_CRASHLOG_SKIP_SYNC=<suffix>[,<suffix>...]: fsync/fdatasync of a file whose path ends
 * with a suffix returns 0 without syncing or being recorded. That breaks the store on
 * purpose, so a test can show the model catches a missing sync.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_OPEN = 1, OP_WRITE, OP_TRUNC, OP_SYNC, OP_CLOSE, OP_RENAME, OP_UNLINK, OP_MKDIR,
       OP_RMDIR, OP_MARK };

struct rec {            /* little-endian, packed by hand: see replay.py RECORD */
    uint32_t op;
    int32_t fd;
    uint64_t ino;
    int64_t off;
    uint64_t len;       /* bytes of data following the paths */
    uint32_t path_len;
    uint32_t path2_len;
};

#define MAXFD 65536
static struct { char *path; uint64_t ino; } fds[MAXFD];
static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static int log_fd = -1;
static char watch[PATH_MAX];
static size_t watch_len;
static char skip_sync[1024];
static int ready;

static ssize_t (*r_write)(int, const void *, size_t);
static ssize_t (*r_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*r_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*r_writev)(int, const struct iovec *, int);
static ssize_t (*r_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*r_pwritev64)(int, const struct iovec *, int, off_t);
static ssize_t (*r_pwritev2)(int, const struct iovec *, int, off_t, int);
static int (*r_open)(const char *, int, ...);
static int (*r_open64)(const char *, int, ...);
static int (*r_openat)(int, const char *, int, ...);
static int (*r_openat64)(int, const char *, int, ...);
static int (*r_creat)(const char *, mode_t);
static int (*r_creat64)(const char *, mode_t);
static int (*r_ftruncate)(int, off_t);
static int (*r_ftruncate64)(int, off_t);
static int (*r_fsync)(int);
static int (*r_fdatasync)(int);
static int (*r_close)(int);
static int (*r_rename)(const char *, const char *);
static int (*r_renameat)(int, const char *, int, const char *);
static int (*r_renameat2)(int, const char *, int, const char *, unsigned int);
static int (*r_unlink)(const char *);
static int (*r_unlinkat)(int, const char *, int);
static int (*r_mkdir)(const char *, mode_t);
static int (*r_mkdirat)(int, const char *, mode_t);
static int (*r_rmdir)(const char *);

#define LOAD(name) r_##name = dlsym(RTLD_NEXT, #name)

__attribute__((constructor)) static void init(void) {
    LOAD(write); LOAD(pwrite); LOAD(pwrite64); LOAD(writev); LOAD(pwritev); LOAD(pwritev64);
    LOAD(pwritev2); LOAD(open); LOAD(open64); LOAD(openat); LOAD(openat64); LOAD(creat);
    LOAD(creat64); LOAD(ftruncate); LOAD(ftruncate64); LOAD(fsync); LOAD(fdatasync);
    LOAD(close); LOAD(rename); LOAD(renameat); LOAD(renameat2); LOAD(unlink); LOAD(unlinkat);
    LOAD(mkdir); LOAD(mkdirat); LOAD(rmdir);
    const char *log = getenv("MEMFS_CRASHLOG"), *dir = getenv("MEMFS_CRASHLOG_DIR");
    const char *skip = getenv("MEMFS_CRASHLOG_SKIP_SYNC");
    if (!log || !dir || !realpath(dir, watch))
        return;
    watch_len = strlen(watch);
    if (skip)
        snprintf(skip_sync, sizeof skip_sync, "%s", skip);
    log_fd = r_open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    ready = log_fd >= 0;
}

static int under_watch(const char *abs) {
    return strncmp(abs, watch, watch_len) == 0 && (abs[watch_len] == '/' || !abs[watch_len]);
}

static void put(const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = r_write(log_fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            abort(); /* a lost record would make the model lie */
        c += w;
        n -= (size_t)w;
    }
}

/* One record; caller holds mu. Data may come as an iovec list. */
static void record(uint32_t op, int fd, uint64_t ino, int64_t off, const char *path,
                   const char *path2, const struct iovec *iov, int iovcnt, size_t len) {
    struct rec r = {op, fd, ino, off, len, path ? (uint32_t)strlen(path) : 0,
                    path2 ? (uint32_t)strlen(path2) : 0};
    /* One buffer, one write: the log stays readable even if the process dies mid-call. */
    size_t total = sizeof r + r.path_len + r.path2_len + len;
    char *buf = malloc(total), *p = buf;
    if (!buf)
        abort();
    memcpy(p, &r, sizeof r); p += sizeof r;
    if (r.path_len) { memcpy(p, path, r.path_len); p += r.path_len; }
    if (r.path2_len) { memcpy(p, path2, r.path2_len); p += r.path2_len; }
    for (int i = 0; i < iovcnt && len; i++) {
        size_t n = iov[i].iov_len < len ? iov[i].iov_len : len;
        memcpy(p, iov[i].iov_base, n);
        p += n;
        len -= n;
    }
    put(buf, total);
    free(buf);
}

/* Absolute path of `path` relative to dirfd, with the parent resolved (the leaf may not
 * exist, or may be a symlink we must not follow). Returns 0 on success. */
static int abs_path(int dirfd, const char *path, char *out) {
    char joined[PATH_MAX * 2], parent[PATH_MAX];
    if (path[0] == '/') {
        snprintf(joined, sizeof joined, "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base))
                return -1;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n < 0)
                return -1;
            base[n] = 0;
        }
        snprintf(joined, sizeof joined, "%s/%s", base, path);
    }
    size_t n = strlen(joined);
    while (n > 1 && joined[n - 1] == '/')
        joined[--n] = 0;
    char *slash = strrchr(joined, '/');
    const char *leaf = slash + 1;
    if (slash == joined) {
        return snprintf(out, PATH_MAX, "/%s", leaf) >= PATH_MAX ? -1 : 0;
    }
    *slash = 0;
    if (!realpath(joined, parent))
        return -1;
    if (snprintf(out, PATH_MAX, "%s/%s", parent, leaf) >= PATH_MAX)
        return -1;
    return 0;
}

static int tracked(int fd) { return ready && fd >= 0 && fd < MAXFD && fds[fd].path; }

static void after_open(int fd, int dirfd, const char *path, int flags) {
    char abs[PATH_MAX];
    if (fd < 0 || fd >= MAXFD || !ready || abs_path(dirfd, path, abs) != 0 || !under_watch(abs))
        return;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    free(fds[fd].path);
    fds[fd].path = strdup(abs);
    fds[fd].ino = st.st_ino;
    record(OP_OPEN, fd, st.st_ino, flags, abs, NULL, NULL, 0, 0);
    if ((flags & O_TRUNC) && S_ISREG(st.st_mode))
        record(OP_TRUNC, fd, st.st_ino, 0, NULL, NULL, NULL, 0, 0);
}

#define OPEN_BODY(call)                                                  \
    mode_t mode = 0;                                                     \
    if (flags & (O_CREAT | O_TMPFILE)) {                                 \
        va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); \
    }                                                                    \
    pthread_mutex_lock(&mu);                                             \
    int fd = call;                                                       \
    int saved = errno;                                                   \
    after_open(fd, dirfd, path, flags);                                  \
    pthread_mutex_unlock(&mu);                                           \
    errno = saved;                                                       \
    return fd;

int open(const char *path, int flags, ...) { int dirfd = AT_FDCWD; OPEN_BODY(r_open(path, flags, mode)) }
int open64(const char *path, int flags, ...) { int dirfd = AT_FDCWD; OPEN_BODY(r_open64(path, flags, mode)) }
int openat(int dirfd, const char *path, int flags, ...) { OPEN_BODY(r_openat(dirfd, path, flags, mode)) }
int openat64(int dirfd, const char *path, int flags, ...) { OPEN_BODY(r_openat64(dirfd, path, flags, mode)) }
int creat(const char *path, mode_t m) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, m); }
int creat64(const char *path, mode_t m) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, m); }

/* A write at `off` (-1: at the fd's position, read before the call) of what the call wrote. */
static ssize_t do_write(int fd, off_t off, const struct iovec *iov, int iovcnt,
                        ssize_t (*call)(void)) {
    if (!tracked(fd))
        return call();
    pthread_mutex_lock(&mu);
    if (off < 0)
        off = (fcntl(fd, F_GETFL) & O_APPEND) ? -1 : lseek(fd, 0, SEEK_CUR);
    ssize_t n = call();
    int saved = errno;
    if (n > 0 && tracked(fd)) {
        if (off < 0) /* O_APPEND: the bytes ended where the file now ends */
            off = lseek(fd, 0, SEEK_END) - n;
        record(OP_WRITE, fd, fds[fd].ino, off, NULL, NULL, iov, iovcnt, (size_t)n);
    }
    pthread_mutex_unlock(&mu);
    errno = saved;
    return n;
}

/* Nested functions would need executable stacks; pass the call through statics instead. */
static __thread struct { int fd; const void *buf; size_t cnt; const struct iovec *iov;
                         int iovcnt; off_t off; int flags; int which; } a;
static ssize_t dispatch(void) {
    switch (a.which) {
    case 0: return r_write(a.fd, a.buf, a.cnt);
    case 1: return r_pwrite(a.fd, a.buf, a.cnt, a.off);
    case 2: return r_pwrite64(a.fd, a.buf, a.cnt, a.off);
    case 3: return r_writev(a.fd, a.iov, a.iovcnt);
    case 4: return r_pwritev(a.fd, a.iov, a.iovcnt, a.off);
    case 5: return r_pwritev64(a.fd, a.iov, a.iovcnt, a.off);
    default: return r_pwritev2(a.fd, a.iov, a.iovcnt, a.off, a.flags);
    }
}

ssize_t write(int fd, const void *buf, size_t cnt) {
    if (!tracked(fd)) return r_write(fd, buf, cnt);
    struct iovec v = {(void *)buf, cnt};
    a.which = 0; a.fd = fd; a.buf = buf; a.cnt = cnt;
    return do_write(fd, -1, &v, 1, dispatch);
}
ssize_t pwrite(int fd, const void *buf, size_t cnt, off_t off) {
    if (!tracked(fd)) return r_pwrite(fd, buf, cnt, off);
    struct iovec v = {(void *)buf, cnt};
    a.which = 1; a.fd = fd; a.buf = buf; a.cnt = cnt; a.off = off;
    return do_write(fd, off, &v, 1, dispatch);
}
ssize_t pwrite64(int fd, const void *buf, size_t cnt, off_t off) {
    if (!tracked(fd)) return r_pwrite64(fd, buf, cnt, off);
    struct iovec v = {(void *)buf, cnt};
    a.which = 2; a.fd = fd; a.buf = buf; a.cnt = cnt; a.off = off;
    return do_write(fd, off, &v, 1, dispatch);
}
ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    if (!tracked(fd)) return r_writev(fd, iov, iovcnt);
    a.which = 3; a.fd = fd; a.iov = iov; a.iovcnt = iovcnt;
    return do_write(fd, -1, iov, iovcnt, dispatch);
}
ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t off) {
    if (!tracked(fd)) return r_pwritev(fd, iov, iovcnt, off);
    a.which = 4; a.fd = fd; a.iov = iov; a.iovcnt = iovcnt; a.off = off;
    return do_write(fd, off, iov, iovcnt, dispatch);
}
ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t off) {
    if (!tracked(fd)) return r_pwritev64(fd, iov, iovcnt, off);
    a.which = 5; a.fd = fd; a.iov = iov; a.iovcnt = iovcnt; a.off = off;
    return do_write(fd, off, iov, iovcnt, dispatch);
}
ssize_t pwritev2(int fd, const struct iovec *iov, int iovcnt, off_t off, int flags) {
    if (!tracked(fd)) return r_pwritev2(fd, iov, iovcnt, off, flags);
    a.which = 6; a.fd = fd; a.iov = iov; a.iovcnt = iovcnt; a.off = off; a.flags = flags;
    return do_write(fd, off, iov, iovcnt, dispatch);
}

static int do_truncate(int fd, off_t len, int (*call)(int, off_t)) {
    if (!tracked(fd)) return call(fd, len);
    pthread_mutex_lock(&mu);
    int rc = call(fd, len), saved = errno;
    if (rc == 0 && tracked(fd))
        record(OP_TRUNC, fd, fds[fd].ino, len, NULL, NULL, NULL, 0, 0);
    pthread_mutex_unlock(&mu);
    errno = saved;
    return rc;
}
int ftruncate(int fd, off_t len) { return do_truncate(fd, len, r_ftruncate); }
int ftruncate64(int fd, off_t len) { return do_truncate(fd, len, r_ftruncate64); }

static int skipped(const char *path) {
    char list[sizeof skip_sync], *save = NULL;
    memcpy(list, skip_sync, sizeof list);
    size_t plen = strlen(path);
    for (char *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        size_t n = strlen(s);
        if (n && plen >= n && strcmp(path + plen - n, s) == 0)
            return 1;
    }
    return 0;
}

static int do_sync(int fd, int (*call)(int)) {
    if (!tracked(fd)) return call(fd);
    pthread_mutex_lock(&mu);
    if (skipped(fds[fd].path)) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    int rc = call(fd), saved = errno;
    if (rc == 0)
        record(OP_SYNC, fd, fds[fd].ino, 0, NULL, NULL, NULL, 0, 0);
    pthread_mutex_unlock(&mu);
    errno = saved;
    return rc;
}
int fsync(int fd) { return do_sync(fd, r_fsync); }
int fdatasync(int fd) { return do_sync(fd, r_fdatasync); }

int close(int fd) {
    if (!tracked(fd)) return r_close(fd);
    pthread_mutex_lock(&mu);
    if (tracked(fd)) {
        record(OP_CLOSE, fd, fds[fd].ino, 0, NULL, NULL, NULL, 0, 0);
        free(fds[fd].path);
        fds[fd].path = NULL;
    }
    int rc = r_close(fd), saved = errno;
    pthread_mutex_unlock(&mu);
    errno = saved;
    return rc;
}

/* Namespace calls: resolved before the call (the leaf's parent must exist for both). */

#define NS_BODY(op, d1, p1, d2, p2, call)                                      \
    if (!ready) return call;                                                   \
    char a1[PATH_MAX], a2[PATH_MAX];                                           \
    pthread_mutex_lock(&mu);                                                   \
    int ok1 = abs_path(d1, p1, a1) == 0 && under_watch(a1);                    \
    int ok2 = p2 && abs_path(d2, p2 ? p2 : "", a2) == 0 && under_watch(a2);    \
    int rc = call, saved = errno;                                              \
    if (rc == 0 && (ok1 || ok2))                                               \
        record(op, -1, 0, 0, ok1 ? a1 : "", p2 ? (ok2 ? a2 : "") : NULL, NULL, 0, 0); \
    pthread_mutex_unlock(&mu);                                                 \
    errno = saved;                                                             \
    return rc;

int rename(const char *o, const char *n) { NS_BODY(OP_RENAME, AT_FDCWD, o, AT_FDCWD, n, r_rename(o, n)) }
int renameat(int od, const char *o, int nd, const char *n) { NS_BODY(OP_RENAME, od, o, nd, n, r_renameat(od, o, nd, n)) }
int renameat2(int od, const char *o, int nd, const char *n, unsigned int fl) {
    if (fl & 2 /* RENAME_EXCHANGE */) {
        errno = EINVAL; /* not modelled: refuse rather than record it wrongly */
        return -1;
    }
    NS_BODY(OP_RENAME, od, o, nd, n, r_renameat2(od, o, nd, n, fl))
}
int unlink(const char *p) { NS_BODY(OP_UNLINK, AT_FDCWD, p, AT_FDCWD, (const char *)NULL, r_unlink(p)) }
int unlinkat(int d, const char *p, int fl) {
    NS_BODY((fl & AT_REMOVEDIR) ? OP_RMDIR : OP_UNLINK, d, p, AT_FDCWD, (const char *)NULL, r_unlinkat(d, p, fl))
}
int rmdir(const char *p) { NS_BODY(OP_RMDIR, AT_FDCWD, p, AT_FDCWD, (const char *)NULL, r_rmdir(p)) }

/* mkdir also records the new directory's inode, so a later fsync of it can be matched. */
static int do_mkdir(int dirfd, const char *p, mode_t m, int (*call)(void)) {
    if (!ready) return call();
    char abs[PATH_MAX];
    pthread_mutex_lock(&mu);
    int ok = abs_path(dirfd, p, abs) == 0 && under_watch(abs);
    int rc = call(), saved = errno;
    struct stat st;
    if (rc == 0 && ok && stat(abs, &st) == 0)
        record(OP_MKDIR, -1, st.st_ino, m, abs, NULL, NULL, 0, 0);
    pthread_mutex_unlock(&mu);
    errno = saved;
    return rc;
}
static __thread struct { int dirfd; const char *p; mode_t m; } mk;
static int mk_plain(void) { return r_mkdir(mk.p, mk.m); }
static int mk_at(void) { return r_mkdirat(mk.dirfd, mk.p, mk.m); }
int mkdir(const char *p, mode_t m) { mk.p = p; mk.m = m; return do_mkdir(AT_FDCWD, p, m, mk_plain); }
int mkdirat(int d, const char *p, mode_t m) {
    mk.dirfd = d; mk.p = p; mk.m = m;
    return do_mkdir(d, p, m, mk_at);
}

/* A label in the log, e.g. "synced 12": the workload calls it through ctypes. */
void crashlog_mark(const char *label) {
    if (!ready) return;
    pthread_mutex_lock(&mu);
    record(OP_MARK, -1, 0, 0, label, NULL, NULL, 0, 0);
    pthread_mutex_unlock(&mu);
}
