/* SPDX-License-Identifier: MIT */
/*
 * mmap, munmap, mremap and madvise as bare system calls, for code that
 * runs while other threads can't run: with them stopped (core/stop.c,
 * backing.c's move of pages) or in a forked child (fork handlers).  The
 * libc entry points may be an application's hooks: UCX's ucm patches them
 * in every loaded library to learn of unmaps, under locks of its own that
 * a stopped thread, or a parent's thread at the fork, may hold for ever.
 * Results as the libc calls (MAP_FAILED or -1, errno set).
 */
#ifndef URDMA_UTIL_RAWMM_H
#define URDMA_UTIL_RAWMM_H

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline void *raw_mmap(void *addr, size_t len, int prot, int flags,
			     int fd, off_t off)
{
	return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
}

/* to: the new address with MREMAP_FIXED, else ignored */
static inline void *raw_mremap(void *old, size_t old_len, size_t len,
			       int flags, void *to)
{
	return (void *)syscall(SYS_mremap, old, old_len, len, flags, to);
}

static inline int raw_munmap(void *addr, size_t len)
{
	return (int)syscall(SYS_munmap, addr, len);
}

static inline int raw_madvise(void *addr, size_t len, int advice)
{
	return (int)syscall(SYS_madvise, addr, len, advice);
}

#endif
