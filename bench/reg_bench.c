// SPDX-License-Identifier: MIT
/*
 * Registration and fork cost, next to memcpy of the same bytes (issue 18).
 *
 * For each size: fresh private anonymous memory, written once (so its
 * pages exist), then ibv_reg_mr timed, next to a memcpy of the same size
 * between two other written buffers; then, with the memory registered,
 * fork() + _exit + waitpid timed (the child gets private copies of
 * registered pages), next to a fork of the same process before the
 * registration.  Prints one markdown table row per size:
 *
 *   | size | reg GB/s | memcpy GB/s | reg/memcpy | fork ms | plain fork ms | memcpy ms |
 *
 * Usage: reg_bench [max_size_MiB] [reps]   (default 1024, 3; medians)
 * Built and run by bench/bench.sh against urdma's libibverbs.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *fresh(size_t len)
{
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (m == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memset(m, 0x5a, len);
	return m;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp);
	return v[n / 2];
}

static double time_fork(void)
{
	double t = now_s();
	pid_t pid = fork();

	if (pid == 0)
		_exit(0);
	waitpid(pid, NULL, 0);
	return now_s() - t;
}

int main(int argc, char **argv)
{
	size_t max = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
	int reps = argc > 2 ? atoi(argv[2]) : 3;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;

	if (!pd) {
		fprintf(stderr, "reg_bench: no device\n");
		return 1;
	}
	if (reps < 1 || reps > 64)
		reps = 3;
	printf("| size | ibv_reg_mr GB/s | memcpy GB/s | reg/memcpy time | fork+exit ms, registered | "
	       "fork+exit ms, before | memcpy ms |\n|---|---|---|---|---|---|---|\n");
	for (size_t len = 4096; len <= max; len *= 4) {
		double reg[64], cpy[64], frk[64], plain[64];

		for (int r = 0; r < reps; r++) {
			char *m = fresh(len), *a = fresh(len), *b = fresh(len);
			struct ibv_mr *mr;
			double t;

			t = now_s();
			memcpy(b, a, len);
			cpy[r] = now_s() - t;
			munmap(a, len);
			munmap(b, len);
			plain[r] = time_fork();
			t = now_s();
			mr = ibv_reg_mr(pd, m, len, IBV_ACCESS_LOCAL_WRITE);
			reg[r] = now_s() - t;
			if (!mr) {
				perror("ibv_reg_mr");
				return 1;
			}
			frk[r] = time_fork();
			ibv_dereg_mr(mr);
			munmap(m, len);
		}
		double tr = median(reg, reps), tc = median(cpy, reps);
		char sz[32];

		if (len >= 1 << 30)
			snprintf(sz, sizeof(sz), "%zu GiB", len >> 30);
		else if (len >= 1 << 20)
			snprintf(sz, sizeof(sz), "%zu MiB", len >> 20);
		else
			snprintf(sz, sizeof(sz), "%zu KiB", len >> 10);
		printf("| %s | %.2f | %.2f | %.1f | %.2f | %.2f | %.3f |\n", sz, len / tr / 1e9,
		       len / tc / 1e9, tr / tc, median(frk, reps) * 1e3, median(plain, reps) * 1e3,
		       tc * 1e3);
		fflush(stdout);
	}
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
