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

static inline uint64_t urdma_clock_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t urdma_now_ns(void)
{
	return urdma_clock_ns(CLOCK_MONOTONIC);
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
