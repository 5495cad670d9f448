/* SPDX-License-Identifier: MIT */
/*
 * The monotonic clock in nanoseconds, for the core, librdmacm and
 * liburdma alike (a vDSO call: no system call), and the pause of their
 * spin loops.
 */
#ifndef URDMA_CLOCK_H
#define URDMA_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t urdma_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

#endif
