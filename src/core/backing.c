// SPDX-License-Identifier: MIT
/*
 * Registered memory: this process's identity memfd, the backing of
 * registered pages, the window tables through which the library reaches
 * backed pages (its own and its peers'), and the fork handler.
 *
 * Registered pages are "backed": their private anonymous (or private file)
 * mapping is replaced, in place and with the same contents and protection,
 * by a MAP_SHARED mapping of the identity memfd at file offset == virtual
 * address.  A peer maps the memfd in 1 GiB windows and reaches any backed
 * page of ours through them.  Windows are never unmapped while the peer is
 * known, so a pointer into one stays valid for the whole of an operation.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/urdma.h"
#include "util/alloc.h"
#include "util/log.h"

static struct urdma_wintab self_win;

void urdma_wintab_release(struct urdma_wintab *t)
{
	for (unsigned int i = 0; i < URDMA_WIN_L1_COUNT; i++) {
		if (!t->l1[i])
			continue;
		for (unsigned int j = 0; j < URDMA_WIN_L2_COUNT; j++)
			if (t->l1[i][j])
				munmap(t->l1[i][j], URDMA_WIN_SIZE);
		urdma_free(t->l1[i]);
		t->l1[i] = NULL;
	}
}

/* Returns the window that holds va, mapping it if needed (under lock). */
static uint8_t *wintab_get(struct urdma_wintab *t, pthread_mutex_t *lock,
			   int memfd, uint64_t va)
{
	uint64_t w = va >> URDMA_WIN_SHIFT;
	unsigned int i = w >> URDMA_WIN_L2_BITS, j = w & (URDMA_WIN_L2_COUNT - 1);
	_Atomic(uint8_t *) *l2;
	uint8_t *base;

	if (va >> URDMA_VA_BITS)
		return NULL;
	l2 = __atomic_load_n(&t->l1[i], __ATOMIC_ACQUIRE);
	if (l2) {
		base = atomic_load_explicit(&l2[j], memory_order_acquire);
		if (base)
			return base;
	}
	if (memfd < 0)
		return NULL;
	pthread_mutex_lock(lock);
	l2 = t->l1[i];
	if (!l2) {
		l2 = urdma_zalloc_array(URDMA_WIN_L2_COUNT, sizeof(*l2));
		if (!l2)
			goto out_unlock;
		__atomic_store_n(&t->l1[i], l2, __ATOMIC_RELEASE);
	}
	base = atomic_load(&l2[j]);
	if (!base) {
		base = mmap(NULL, URDMA_WIN_SIZE, PROT_READ | PROT_WRITE,
			    MAP_SHARED | MAP_NORESERVE, memfd, w << URDMA_WIN_SHIFT);
		if (base == MAP_FAILED) {
			urdma_warn("mapping a window of memfd %d failed: %m",
				   memfd);
			base = NULL;
			goto out_unlock;
		}
		atomic_store_explicit(&l2[j], base, memory_order_release);
	}
	pthread_mutex_unlock(lock);
	return base;
out_unlock:
	pthread_mutex_unlock(lock);
	return NULL;
}

void *urdma_wintab_ptr(struct urdma_wintab *t, pthread_mutex_t *lock,
			int memfd, uint64_t va, uint64_t *avail)
{
	uint8_t *base = wintab_get(t, lock, memfd, va);

	if (!base)
		return NULL;
	*avail = URDMA_WIN_SIZE - (va & (URDMA_WIN_SIZE - 1));
	return base + (va & (URDMA_WIN_SIZE - 1));
}

/*
 * In a forked child, registered pages would stay shared with the parent.
 * Give the child private copies (what fork promises) and drop our windows.
 * The child is single-threaded here.
 */
void urdma_backing_atfork_child(void)
{
	FILE *f;
	char line[512];

	if (urdma_proc.memfd < 0)
		return;
	f = fopen("/proc/self/maps", "re");
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long start, end, off, ino;
		char perms[8];
		void *tmp;

		if (sscanf(line, "%lx-%lx %7s %lx %*s %lu", &start, &end, perms,
			   &off, &ino) != 5 || ino != urdma_proc.memfd_ino)
			continue;
		if (off != start || perms[0] != 'r') {
			munmap((void *)start, end - start);
			continue;
		}
		tmp = mmap(NULL, end - start, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (tmp == MAP_FAILED)
			continue;
		/* From the memfd (identity offsets), not through the mapping:
		 * the same bytes, and a sanitizer does not take whole pages
		 * of a registered heap for an overflow. */
		for (size_t got = 0, k; got < end - start; got += k) {
			ssize_t r = pread(urdma_proc.memfd, (char *)tmp + got,
					  end - start - got, (off_t)(off + got));

			if (r <= 0) {
				memcpy((char *)tmp + got, (char *)start + got,
				       end - start - got);
				break;
			}
			k = (size_t)r;
		}
		mprotect(tmp, end - start,
			 (perms[0] == 'r' ? PROT_READ : 0) |
				 (perms[1] == 'w' ? PROT_WRITE : 0) |
				 (perms[2] == 'x' ? PROT_EXEC : 0));
		mremap(tmp, end - start, end - start,
		       MREMAP_MAYMOVE | MREMAP_FIXED, (void *)start);
	}
	if (f)
		fclose(f);
	close(urdma_proc.memfd);
	urdma_proc.memfd = -1;
	urdma_proc.memfd_ino = 0;
	memset(&self_win, 0, sizeof(self_win));
}

static int memfd_create_locked(void)
{
	struct stat st;
	int fd;

	if (urdma_proc.memfd >= 0)
		return 0;
	fd = memfd_create("urdma", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* Peers map it (core/host.c): sealed, nobody can shrink it under
	 * their mappings (a SIGBUS), nor seal it against our own use. */
	if (ftruncate(fd, 1ULL << URDMA_VA_BITS) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ||
	    fstat(fd, &st) < 0) {
		int err = errno;

		close(fd);
		return -err;
	}
	urdma_proc.memfd_ino = st.st_ino;
	urdma_proc.memfd = fd;
	return 0;
}

/* The identity memfd, created on first use; -errno if it can't be. */
int urdma_memfd(void)
{
	int ret;

	pthread_mutex_lock(&urdma_proc.lock);
	ret = memfd_create_locked();
	if (!ret)
		ret = urdma_proc.memfd;
	pthread_mutex_unlock(&urdma_proc.lock);
	return ret;
}

struct vma {
	uint64_t start, end, off, ino;
	char perms[8];
};

static int prot_of(const char *perms)
{
	return (perms[0] == 'r' ? PROT_READ : 0) |
	       (perms[1] == 'w' ? PROT_WRITE : 0) |
	       (perms[2] == 'x' ? PROT_EXEC : 0);
}

/*
 * Back [start, start+len) (page aligned) with the identity memfd.  Pages
 * already backed are left alone; private mappings are copied into the memfd
 * and replaced in place.  Shared mappings of other files can't be backed.
 * Called with urdma_proc.lock held.
 */
static int back_range_locked(uint64_t start, uint64_t len)
{
	uint64_t end = start + len, cur = start;
	struct vma *v = NULL;
	int nv = 0, cap = 0, ret = 0;
	char line[512];
	FILE *f;

	ret = memfd_create_locked();
	if (ret)
		return ret;
	f = fopen("/proc/self/maps", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		struct vma x;

		if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64
				 " %*s %" SCNu64,
			   &x.start, &x.end, x.perms, &x.off, &x.ino) != 5)
			continue;
		if (x.end <= start || x.start >= end)
			continue;
		if (nv == cap) {
			struct vma *nvv;

			cap = cap ? cap * 2 : 8;
			nvv = realloc(v, cap * sizeof(*v));
			if (!nvv) {
				ret = -ENOMEM;
				goto out;
			}
			v = nvv;
		}
		v[nv++] = x;
	}
	/* Check everything first: no hole, readable, backable. */
	for (int i = 0; i < nv; i++) {
		if (v[i].start > cur || v[i].perms[0] != 'r') {
			ret = -EFAULT;
			goto out;
		}
		if (v[i].ino == urdma_proc.memfd_ino && v[i].off == v[i].start)
			;
		else if (v[i].perms[3] != 'p') {
			urdma_warn("can't register [%#" PRIx64 ", %#" PRIx64
				   "): a shared mapping of another file",
				   v[i].start, v[i].end);
			ret = -EOPNOTSUPP;
			goto out;
		}
		cur = v[i].end;
	}
	if (cur < end) {
		ret = -EFAULT;
		goto out;
	}
	for (int i = 0; i < nv; i++) {
		uint64_t s = v[i].start < start ? start : v[i].start;
		uint64_t e = v[i].end > end ? end : v[i].end;
		uint64_t done = 0;
		void *m;

		if (v[i].ino == urdma_proc.memfd_ino && v[i].off == v[i].start)
			continue;
		while (done < e - s) {
			/* The raw syscall: whole pages are copied, including
			 * bytes a sanitizer's pwrite() would call redzones. */
			ssize_t n = syscall(SYS_pwrite64, urdma_proc.memfd,
					    (void *)(s + done), e - s - done,
					    s + done);
			if (n <= 0) {
				ret = n < 0 ? -errno : -EIO;
				goto out;
			}
			done += n;
		}
		m = mmap((void *)s, e - s, prot_of(v[i].perms),
			 MAP_SHARED | MAP_FIXED, urdma_proc.memfd, s);
		if (m == MAP_FAILED) {
			ret = -errno;
			urdma_err("backing [%#" PRIx64 ", %#" PRIx64 ") failed: %m",
				  s, e);
			goto out;
		}
	}
out:
	fclose(f);
	free(v);
	return ret;
}

int urdma_host_back_range(uint64_t start, uint64_t len)
{
	int ret;

	pthread_mutex_lock(&urdma_proc.lock);
	ret = back_range_locked(start, len);
	pthread_mutex_unlock(&urdma_proc.lock);
	return ret;
}

void *urdma_self_ptr(uint64_t va, uint64_t *avail)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

	return urdma_wintab_ptr(&self_win, &lock, urdma_proc.memfd, va, avail);
}
