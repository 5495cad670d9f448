/* SPDX-License-Identifier: MIT */
/*
 * liburdma_view.so: the device files as tools look for them.
 *
 * Middleware finds RDMA devices through files as well as through verbs:
 * UCX skips a device without a character device /dev/infiniband/<dev_name>
 * and reads GID types from /sys/class/infiniband/<dev>/ports/<p>/gid_attrs;
 * Open MPI's openib checks that /sys/class/infiniband exists, hwloc reads
 * a device's local_cpus, rdma-core's tools map devices to netdevs through
 * device/net.  urdma has no kernel module, so none of these exist, and a
 * user can't create them.
 *
 * `urdma run` preloads this library (LD_PRELOAD), which gives the program
 * a private view of those paths: an absolute path under /sys/class/
 * infiniband, /sys/class/infiniband_verbs or /dev/infiniband, handed to
 * open, fopen, stat, access, opendir, readlink or realpath (and their
 * 64-bit, *at and fortified forms), is looked up in a tree this process
 * builds on first use from urdma's device, as libibverbs reports it
 * (view_gen.c): the node and port attributes, every GID with its type and
 * netdev, the pkey, device/{numa_node,local_cpus,net/<netdev>}, the
 * uverbs class files, and /dev/infiniband/<dev_name> and rdma_cm as links
 * to /dev/null (a character device anyone may open: nothing reads it).
 * Every other path is the real one.  realpath gives the virtual path back.
 *
 * The tree is view-<pid>-<random> in the user's host directory
 * (/dev/shm/urdma-<uid> or URDMA_SHM_DIR, which must be ours and writable
 * by nobody else, as libibverbs requires), made with *at calls relative to
 * it, never through a link, from the libibverbs next to this library
 * (urdma's).  Its process holds it flock'd and reaches it through
 * /proc/self/fd/N (an fd kept at 700 or above), never by its path again.
 * It goes when the process exits; a tree nobody holds (its process died,
 * or exec'd) is swept when another is made.  A child of fork() makes its
 * own.
 *
 * Not covered: statically linked programs, setuid programs (the loader
 * ignores LD_PRELOAD), system calls made without libc (io_uring, raw
 * syscall()), glibc calls that open directories internally (scandir,
 * nftw, glob, fts), relative paths under a directory fd of the real
 * /sys (hwloc's), and iproute2's `rdma` tool (it asks the kernel over
 * netlink).  URDMA_VIEW=0 turns the view off.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/host_dir.h"
#include "view/view.h"

static const char *const view_prefixes[] = {
	"/sys/class/infiniband",
	"/sys/class/infiniband_verbs",
	"/dev/infiniband",
};

static pthread_once_t view_once = PTHREAD_ONCE_INIT;
static char view_root[64];		/* /proc/self/fd/N: the tree, by fd */
static size_t view_root_len;		/* 0: no view (yet) */
static char view_canon[PATH_MAX];	/* the tree's path, for realpath */
static size_t view_canon_len;
static char view_name[64];		/* view-<pid>-<random> in the host dir */
static int view_fd = -1;		/* the tree, flock'd shared while ours */
static pid_t view_pid;
static __thread int view_busy;		/* making the tree: no mapping */

#define VIEW_FD_MIN 700	/* out of the way of the program's own fds */

void *view_real(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

#define REAL(ret, name, ...)                                                \
	static ret (*real_##name)(__VA_ARGS__);                              \
	if (!real_##name)                                                   \
		real_##name = (ret(*)(__VA_ARGS__))view_real(#name)

/* Remove the tree name in dirfd (ours: nothing followed). */
static void view_rm(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d;
	struct dirent *e;

	if (fd < 0) {
		unlinkat(dirfd, name, 0);
		return;
	}
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			view_rm(fd, e->d_name);
	closedir(d);
	unlinkat(dirfd, name, AT_REMOVEDIR);
}

/* The host directory, checked as libibverbs checks it
 * (util/host_dir.c).  Its fd, or -1. */
static int view_host_dir(void)
{
	char path[PATH_MAX];
	struct stat st;
	int fd;

	urdma_host_dir_path(path, sizeof(path));
	fd = urdma_private_dir_open(path, &st);
	return fd < 0 ? -1 : fd;
}

/* Trees nobody holds (their process died, or exec'd): each live tree is
 * flock'd shared by its process, whatever its PID namespace. */
static void view_sweep(int hostfd)
{
	int fd = dup(hostfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d))) {
		int t;

		if (strncmp(e->d_name, "view-", 5))
			continue;
		t = openat(hostfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (t < 0)
			continue;
		if (!flock(t, LOCK_EX | LOCK_NB))
			view_rm(hostfd, e->d_name);
		close(t);
	}
	closedir(d);
}

static void view_cleanup(void)
{
	int hostfd;

	if (!view_root_len || view_pid != getpid())
		return;
	hostfd = view_host_dir();
	if (hostfd >= 0) {
		view_rm(hostfd, view_name);
		close(hostfd);
	}
	view_root_len = 0;
}

static void view_atfork_child(void)
{
	/* the parent's tree is the parent's: the child makes its own */
	if (view_fd >= 0)
		close(view_fd);
	view_fd = -1;
	view_root_len = 0;
	view_canon_len = 0;
	view_once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

/* urdma's libibverbs: the one next to this library (another one, say
 * rdma-core's, would read the real sysfs through us while we make the
 * tree).  0, or -1 if it is not there. */
static int view_verbs_path(char *buf, size_t len)
{
	Dl_info info;
	const char *slash;

	if (!dladdr((void *)view_atfork_child, &info) || !info.dli_fname)
		return -1;
	slash = strrchr(info.dli_fname, '/');
	if (!slash || (size_t)(slash - info.dli_fname) + sizeof("/libibverbs.so.1") > len)
		return -1;
	memcpy(buf, info.dli_fname, (size_t)(slash - info.dli_fname));
	strcpy(buf + (slash - info.dli_fname), "/libibverbs.so.1");
	return access(buf, R_OK) ? -1 : 0;
}

static void view_make(void)
{
	char tmp[64], verbs[PATH_MAX];
	const char *env = getenv("URDMA_VIEW");
	uint32_t rnd = 0;
	int hostfd, rootfd = -1, fd;
	ssize_t n;

	if ((env && !strcmp(env, "0")) || view_verbs_path(verbs, sizeof(verbs)))
		return;
	view_busy++;
	hostfd = view_host_dir();
	if (hostfd < 0)
		goto out;
	view_sweep(hostfd);
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
		rnd = (uint32_t)(uintptr_t)&rnd ^ (uint32_t)getpid() * 2654435761u;
	/* made as new-*, flock'd, then named view-*: a sweep never sees a
	 * tree before its lock */
	snprintf(tmp, sizeof(tmp), "new-%d-%08x", (int)getpid(), rnd);
	snprintf(view_name, sizeof(view_name), "view-%d-%08x", (int)getpid(), rnd);
	if (mkdirat(hostfd, tmp, 0700))
		goto out_host;
	rootfd = openat(hostfd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (rootfd < 0 || flock(rootfd, LOCK_SH) ||
	    renameat(hostfd, tmp, hostfd, view_name)) {
		view_rm(hostfd, tmp);
		goto out_host;
	}
	if (view_generate(rootfd, verbs))
		goto out_rm;
	/* the tree by fd (what its path names can't change under us) */
	fd = fcntl(rootfd, F_DUPFD_CLOEXEC, VIEW_FD_MIN);
	if (fd < 0)
		goto out_rm;
	close(rootfd);
	rootfd = fd;
	snprintf(view_root, sizeof(view_root), "/proc/self/fd/%d", rootfd);
	n = readlink(view_root, view_canon, sizeof(view_canon) - 1);
	view_canon_len = n > 0 ? (size_t)n : 0;
	view_canon[view_canon_len] = 0;
	view_fd = rootfd;
	rootfd = -1;
	view_pid = getpid();
	view_root_len = strlen(view_root);
	goto out_host;
out_rm:
	view_rm(hostfd, view_name);
out_host:
	if (rootfd >= 0)
		close(rootfd);
	close(hostfd);
out:
	view_busy--;
}

__attribute__((constructor)) static void view_init(void)
{
	pthread_atfork(NULL, NULL, view_atfork_child);
	atexit(view_cleanup);
}

/* path, or where the view has it (in buf).  errno is kept. */
static const char *view_map(const char *path, char *buf, size_t len)
{
	size_t n;
	int err;

	if (!path || path[0] != '/' || view_busy)
		return path;
	for (size_t i = 0; i < sizeof(view_prefixes) / sizeof(*view_prefixes); i++) {
		n = strlen(view_prefixes[i]);
		if (!strncmp(path, view_prefixes[i], n) &&
		    (path[n] == 0 || path[n] == '/'))
			goto hit;
	}
	return path;
hit:
	err = errno;
	pthread_once(&view_once, view_make);
	errno = err;
	if (!view_root_len || view_root_len + strlen(path) + 1 > len)
		return path;
	memcpy(buf, view_root, view_root_len);
	strcpy(buf + view_root_len, path);
	return buf;
}

#define MAP(p) char map_buf_[PATH_MAX]; const char *mp_ = view_map(p, map_buf_, sizeof(map_buf_))

/* ---- open ---- */

static mode_t open_mode(int flags, va_list ap)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ?
		       (mode_t)va_arg(ap, int) : 0;
}

VIEW_EXPORT int open(const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;
	REAL(int, open, const char *, int, ...);
	MAP(path);

	va_start(ap, flags);
	mode = open_mode(flags, ap);
	va_end(ap);
	return real_open(mp_, flags, mode);
}

VIEW_EXPORT int open64(const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;
	REAL(int, open64, const char *, int, ...);
	MAP(path);

	va_start(ap, flags);
	mode = open_mode(flags, ap);
	va_end(ap);
	return real_open64(mp_, flags, mode);
}

VIEW_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;
	REAL(int, openat, int, const char *, int, ...);
	MAP(path);

	va_start(ap, flags);
	mode = open_mode(flags, ap);
	va_end(ap);
	return real_openat(dirfd, mp_, flags, mode);
}

VIEW_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;
	REAL(int, openat64, int, const char *, int, ...);
	MAP(path);

	va_start(ap, flags);
	mode = open_mode(flags, ap);
	va_end(ap);
	return real_openat64(dirfd, mp_, flags, mode);
}

VIEW_EXPORT int __open_2(const char *path, int flags)
{
	REAL(int, __open_2, const char *, int);
	MAP(path);
	return real___open_2(mp_, flags);
}

VIEW_EXPORT int __open64_2(const char *path, int flags)
{
	REAL(int, __open64_2, const char *, int);
	MAP(path);
	return real___open64_2(mp_, flags);
}

VIEW_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	REAL(int, __openat_2, int, const char *, int);
	MAP(path);
	return real___openat_2(dirfd, mp_, flags);
}

VIEW_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
	REAL(int, __openat64_2, int, const char *, int);
	MAP(path);
	return real___openat64_2(dirfd, mp_, flags);
}

VIEW_EXPORT FILE *fopen(const char *path, const char *mode)
{
	REAL(FILE *, fopen, const char *, const char *);
	MAP(path);
	return real_fopen(mp_, mode);
}

VIEW_EXPORT FILE *fopen64(const char *path, const char *mode)
{
	REAL(FILE *, fopen64, const char *, const char *);
	MAP(path);
	return real_fopen64(mp_, mode);
}

/* ---- stat (the glibc 2.33 functions, and the __xstat ones before) ----
 *
 * Before glibc 2.33 libc has no stat, lstat, fstatat: programs call
 * __xstat & co, whose wrappers below land here; the real call is then the
 * versioned __xstat one. */

#define XREAL(ret, name, xname, ...)                                          \
	REAL(ret, name, __VA_ARGS__);                                         \
	static ret (*x_##name)(int, __VA_ARGS__);                             \
	if (!real_##name && !x_##name)                                        \
		x_##name = (ret(*)(int, __VA_ARGS__))dlvsym(RTLD_NEXT, xname, \
							    "GLIBC_2.2.5")
#define XCALL(name, ...)                                                      \
	(real_##name ? real_##name(__VA_ARGS__) :                             \
	 x_##name ? x_##name(1, __VA_ARGS__) : (errno = ENOSYS, -1))

VIEW_EXPORT int stat(const char *path, struct stat *st)
{
	XREAL(int, stat, "__xstat", const char *, struct stat *);
	MAP(path);
	return XCALL(stat, mp_, st);
}

VIEW_EXPORT int stat64(const char *path, struct stat64 *st)
{
	XREAL(int, stat64, "__xstat64", const char *, struct stat64 *);
	MAP(path);
	return XCALL(stat64, mp_, st);
}

VIEW_EXPORT int lstat(const char *path, struct stat *st)
{
	XREAL(int, lstat, "__lxstat", const char *, struct stat *);
	MAP(path);
	return XCALL(lstat, mp_, st);
}

VIEW_EXPORT int lstat64(const char *path, struct stat64 *st)
{
	XREAL(int, lstat64, "__lxstat64", const char *, struct stat64 *);
	MAP(path);
	return XCALL(lstat64, mp_, st);
}

VIEW_EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	XREAL(int, fstatat, "__fxstatat", int, const char *, struct stat *, int);
	MAP(path);
	return XCALL(fstatat, dirfd, mp_, st, flags);
}

VIEW_EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
	XREAL(int, fstatat64, "__fxstatat64", int, const char *, struct stat64 *, int);
	MAP(path);
	return XCALL(fstatat64, dirfd, mp_, st, flags);
}

/* (x86-64's struct stat is the kernel's: the version is always 1) */
VIEW_EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
	(void)ver;
	return stat(path, st);
}

VIEW_EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
	(void)ver;
	return stat64(path, st);
}

VIEW_EXPORT int __lxstat(int ver, const char *path, struct stat *st)
{
	(void)ver;
	return lstat(path, st);
}

VIEW_EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st)
{
	(void)ver;
	return lstat64(path, st);
}

VIEW_EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *st,
			   int flags)
{
	(void)ver;
	return fstatat(dirfd, path, st, flags);
}

VIEW_EXPORT int __fxstatat64(int ver, int dirfd, const char *path,
			     struct stat64 *st, int flags)
{
	(void)ver;
	return fstatat64(dirfd, path, st, flags);
}

VIEW_EXPORT int statx(int dirfd, const char *path, int flags, unsigned int mask,
		      struct statx *stx)
{
	REAL(int, statx, int, const char *, int, unsigned int, struct statx *);
	MAP(path);
	return real_statx(dirfd, mp_, flags, mask, stx);
}

/* ---- access, directories, links ---- */

VIEW_EXPORT int access(const char *path, int mode)
{
	REAL(int, access, const char *, int);
	MAP(path);
	return real_access(mp_, mode);
}

VIEW_EXPORT int faccessat(int dirfd, const char *path, int mode, int flags)
{
	REAL(int, faccessat, int, const char *, int, int);
	MAP(path);
	return real_faccessat(dirfd, mp_, mode, flags);
}

VIEW_EXPORT int euidaccess(const char *path, int mode)
{
	REAL(int, euidaccess, const char *, int);
	MAP(path);
	return real_euidaccess(mp_, mode);
}

VIEW_EXPORT int eaccess(const char *path, int mode)
{
	return euidaccess(path, mode);
}

VIEW_EXPORT DIR *opendir(const char *path)
{
	REAL(DIR *, opendir, const char *);
	MAP(path);
	return real_opendir(mp_);
}

VIEW_EXPORT ssize_t readlink(const char *path, char *buf, size_t len)
{
	REAL(ssize_t, readlink, const char *, char *, size_t);
	MAP(path);
	return real_readlink(mp_, buf, len);
}

VIEW_EXPORT ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t len)
{
	REAL(ssize_t, readlinkat, int, const char *, char *, size_t);
	MAP(path);
	return real_readlinkat(dirfd, mp_, buf, len);
}

/* The view's path back as the virtual one (a link to /dev/null stays). */
static void view_unmap(char *p)
{
	if (view_canon_len && !strncmp(p, view_canon, view_canon_len) &&
	    (p[view_canon_len] == '/' || !p[view_canon_len]))
		memmove(p, p + view_canon_len, strlen(p + view_canon_len) + 1);
}

VIEW_EXPORT char *realpath(const char *path, char *resolved)
{
	REAL(char *, realpath, const char *, char *);
	MAP(path);
	char *r = real_realpath(mp_, resolved);

	if (r && mp_ != path)
		view_unmap(r);
	return r;
}

VIEW_EXPORT char *__realpath_chk(const char *path, char *resolved, size_t len)
{
	if (resolved && len < PATH_MAX)
		abort();	/* (as glibc's __chk_fail) */
	return realpath(path, resolved);
}

VIEW_EXPORT ssize_t __readlink_chk(const char *path, char *buf, size_t len,
				   size_t buflen)
{
	if (len > buflen)
		abort();
	return readlink(path, buf, len);
}

VIEW_EXPORT ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf,
				     size_t len, size_t buflen)
{
	if (len > buflen)
		abort();
	return readlinkat(dirfd, path, buf, len);
}
