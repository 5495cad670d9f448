// SPDX-License-Identifier: MIT
/* Unit tests of the core's data structures: the shared MR table, span
 * copies, and backing pages with the identity memfd; waking a peer that
 * died; a CQ's shared block reused; and the TCP transport's CRC32c. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/urdma.h"
#include "iwarp_frames.h" /* iwf_crc32c: CRC32c by its definition */
#include "transport/tcp/crc32c.h"
#include "transport/transport.h"
#include "util/alloc.h"
#include "util/fdpoll.h"

static int failures, checks;
#define CHECK(c)                                                               \
	do {                                                                   \
		checks++;                                                      \
		if (!(c)) {                                                    \
			failures++;                                            \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, \
				__LINE__, #c);                                 \
		}                                                              \
	} while (0)

static void test_mr_lookup(void)
{
	struct urdma_shm_ctx *shm = calloc(1, sizeof(*shm));
	struct urdma_shm_mr *e = &shm->mr[5];
	uint32_t key = (5u << URDMA_MR_TAG_BITS) | 0x1234;
	uint64_t va = 0;
	bool direct = true;

	e->access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	e->pd_id = 7;
	e->iova = 0x10000;
	e->length = 0x1000;
	e->va = 0x7f0000;
	atomic_store(&e->key, key);

	CHECK(urdma_mr_lookup(shm, key, 0x10000, 0x1000, IBV_ACCESS_REMOTE_WRITE, 7, URDMA_VIA_LOCAL, &va, &direct) == 0);
	CHECK(va == 0x7f0000 && !direct);
	CHECK(urdma_mr_lookup(shm, key, 0x10010, 16, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == 0 && va == 0x7f0010);
	/* a key with another tag, or a free slot */
	CHECK(urdma_mr_lookup(shm, key ^ (1u << 4), 0x10000, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -EINVAL);
	CHECK(urdma_mr_lookup(shm, 6, 0x10000, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -EINVAL);
	CHECK(urdma_mr_lookup(shm, 0, 0x10000, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -EINVAL);
	/* rights and PD */
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, IBV_ACCESS_REMOTE_READ, 7, URDMA_VIA_LOCAL, &va, &direct) == -EACCES);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 8, URDMA_VIA_LOCAL, &va, &direct) == -EACCES);
	/* bounds, including overflow */
	CHECK(urdma_mr_lookup(shm, key, 0xffff, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -ERANGE);
	CHECK(urdma_mr_lookup(shm, key, 0x10ff9, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -ERANGE);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 0x1001, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -ERANGE);
	CHECK(urdma_mr_lookup(shm, key, 0x10008, UINT64_MAX, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -ERANGE);
	CHECK(urdma_mr_lookup(shm, key, UINT64_MAX - 3, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -ERANGE);
	/* a direct MR says so */
	atomic_store(&e->flags, URDMA_MR_F_DIRECT);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == 0 && direct);
	/* pages the owner unmapped */
	atomic_store(&e->flags, URDMA_MR_F_UNMAPPED);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -EFAULT);
	/* a memory window: never a local key; a type 2 one (qpn set) only
	 * through its QP */
	atomic_store(&e->flags, URDMA_MR_F_MW);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 7, URDMA_VIA_LOCAL, &va, &direct) == -EINVAL);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 7, 0x123, &va, &direct) == 0);
	e->qpn = 0x456;
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 7, 0x123, &va, &direct) == -EINVAL);
	CHECK(urdma_mr_lookup(shm, key, 0x10000, 8, 0, 7, 0x456, &va, &direct) == 0);
	/* keys: the index above the tag; random bits that leave no tag
	 * (the low URDMA_MR_TAG_BITS bits zero) give none, so entry 0 never
	 * gets key 0, which no lookup accepts */
	CHECK(urdma_mr_key(5, 0x1234) == key);
	CHECK(urdma_mr_key(0, 1u << URDMA_MR_TAG_BITS) == 0);
	CHECK(urdma_mr_key(7, 0xffffffffu << URDMA_MR_TAG_BITS) == 0);
	CHECK(urdma_mr_key(0, 0x12345) != 0 && URDMA_MR_IDX(urdma_mr_key(0, 0x12345)) == 0);
	free(shm);
}

static void test_copy_spans(void)
{
	uint8_t src[100], dst[100];
	struct urdma_span s[3] = { { .len = 10, .ptr = src },
				   { .len = 0, .ptr = src + 10 },
				   { .len = 90, .ptr = src + 10 } };
	struct urdma_span d[2] = { { .len = 33, .ptr = dst },
				   { .len = 67, .ptr = dst + 33 } };

	for (int i = 0; i < 100; i++)
		src[i] = i;
	memset(dst, 0xee, sizeof(dst));
	CHECK(urdma_copy_spans(NULL, d, 2, NULL, s, 3, 100) == 0);
	CHECK(memcmp(src, dst, 100) == 0);
	/* more than the destination holds */
	CHECK(urdma_copy_spans(NULL, d, 1, NULL, s, 3, 34) == -ERANGE);
}

static void test_backing(void)
{
	size_t len = 3 * 4096 + 100;
	char *buf = malloc(len);
	uint64_t avail = 0;
	char *p;

	CHECK(urdma_host_init() == 0);
	memset(buf, 'a', len);
	uint64_t start = (uintptr_t)buf & ~4095ull;
	uint64_t end = ((uintptr_t)buf + len + 4095) & ~4095ull;
	CHECK(urdma_host_back_range(start, end - start, true) == 0);
	/* contents kept, and the library's window sees the same bytes */
	CHECK(buf[0] == 'a' && buf[len - 1] == 'a');
	p = urdma_self_ptr((uintptr_t)buf, &avail);
	CHECK(p && avail >= len);
	if (p) {
		p[7] = 'z';
		CHECK(buf[7] == 'z');
		buf[9] = 'y';
		CHECK(p[9] == 'y');
	}
	/* backing again is a no-op */
	CHECK(urdma_host_back_range(start, end - start, true) == 0);
	CHECK(buf[7] == 'z');
	/* A forked child gets private copies of backed pages, as fork
	 * promises: it sees the bytes as they were, and what it writes
	 * stays its own (host_atfork_child). */
	pid_t pid = fork();
	if (pid == 0) {
		bool same = buf[0] == 'a' && buf[7] == 'z' && buf[9] == 'y' &&
			    buf[len - 1] == 'a';
		memset(buf, 'c', len);
		_exit(same ? 0 : 1);
	}
	int status = -1;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(buf[0] == 'a' && buf[7] == 'z' && buf[len - 1] == 'a');
	/* a hole is refused */
	char *m = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(m + 4096, 4096);
	CHECK(urdma_host_back_range((uintptr_t)m, 3 * 4096, true) == -EFAULT);
	/* a shared mapping of another object stays in place (direct) */
	char *sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(urdma_host_back_range((uintptr_t)sh, 4096, true) == 1);
	/* read-only pages can't be registered for writing */
	mprotect(sh, 4096, PROT_READ);
	CHECK(urdma_host_back_range((uintptr_t)sh, 4096, true) == -EFAULT);
	CHECK(urdma_host_back_range((uintptr_t)sh, 4096, false) == 1);
	munmap(sh, 4096);
	munmap(m, 4096);
	munmap(m + 8192, 4096);
	free(buf);
}

static void test_roundup(void)
{
	CHECK(roundup_pow2(1) == 1);
	CHECK(roundup_pow2(3) == 4);
	CHECK(roundup_pow2(4096) == 4096);
	CHECK(roundup_pow2(4097) == 8192);
}

static void test_crc32c(void)
{
	static uint8_t buf[20000];
	uint32_t seed = 12345;

	/* The check value of the CRC-32C catalogue. */
	CHECK(urdma_crc32c("123456789", 9) == 0xe3069283u);
	for (size_t i = 0; i < sizeof(buf); i++) {
		seed = seed * 1103515245u + 12345u;
		buf[i] = seed >> 16;
	}
	/* Every implementation this CPU runs, every path: short, around the
	 * three-stream blocks and the 256-byte folding rounds, odd starts,
	 * and pieces fed one after another. */
	const struct urdma_crc32c_impl *impl;
	int n = urdma_crc32c_impls(&impl);

	CHECK(n >= 1);
	for (int i = 0; i < n; i++)
		printf("crc32c: %s%s\n", impl[i].name, i ? "" : " (in use)");
	for (int i = 0; i < n; i++) {
		for (size_t len = 0; len <= sizeof(buf) - 7;
		     len += len < 600 ? 1 : 997) {
			for (size_t off = 0; off < 4; off += 3) {
				uint32_t want = iwf_crc32c(buf + off, len);
				uint32_t half = impl[i].update(~0u, buf + off,
							       len / 3);

				/* The dispatcher uses impl[0]. */
				if ((!i && urdma_crc32c(buf + off, len) != want) ||
				    ~impl[i].update(~0u, buf + off, len) != want ||
				    ~impl[i].update(half, buf + off + len / 3,
						    len - len / 3) != want) {
					fprintf(stderr, "crc32c %s: len %zu off %zu\n",
						impl[i].name, len, off);
					CHECK(0);
				}
			}
		}
	}
	CHECK(urdma_crc32c(buf, 4096) == iwf_crc32c(buf, 4096));
}

/* Whether the page of p holds one of the malloc'd blocks[]. */
static int shares_page(const void *p, void **blocks, int n)
{
	uintptr_t page = (uintptr_t)p & ~(uintptr_t)4095;

	for (int i = 0; i < n; i++)
		if (((uintptr_t)blocks[i] & ~(uintptr_t)4095) == page)
			return 1;
	return 0;
}

/* util/alloc.c: zeroed, aligned, and never on a page that malloc hands
 * out, so that ibv_reg_mr of an application buffer never copies a page
 * the library's threads are writing (core/backing.c, back_range_locked). */
static void test_alloc(void)
{
	static const size_t sizes[] = { 1, 60, 64, 100, 400, 960, 961, 5000, 300000 };
	void *obj[64], *blocks[512];
	int nobj = 0;

	for (int i = 0; i < 512; i++) {
		blocks[i] = malloc(24 + (size_t)(i % 7) * 40);
		if (i % 8 == 0 && nobj < 64) {
			size_t sz = sizes[nobj % (sizeof(sizes) / sizeof(sizes[0]))];
			unsigned char *o = urdma_zalloc(sz);

			CHECK(o && ((uintptr_t)o & 63) == 0);
			if (!o)
				continue;
			for (size_t k = 0; k < sz; k++)
				CHECK(o[k] == 0);
			memset(o, 0xa5, sz); /* dirty: a reused slot must come back zeroed */
			obj[nobj++] = o;
		}
	}
	for (int i = 0; i < nobj; i++)
		CHECK(!shares_page(obj[i], blocks, 512));
	for (int i = 0; i < nobj; i++)
		urdma_free(obj[i]);
	for (int i = 0; i < nobj; i++) {
		size_t sz = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
		unsigned char *o = urdma_zalloc(sz);
		int dirty = 0;

		CHECK(o != NULL);
		for (size_t k = 0; o && k < sz; k++)
			dirty |= o[k];
		CHECK(!dirty);
		urdma_free(o);
	}
	for (int i = 0; i < 512; i++)
		free(blocks[i]);
	urdma_free(NULL);
	errno = 0;
	CHECK(urdma_zalloc_array(SIZE_MAX / 2, 4) == NULL && errno == ENOMEM);
	CHECK(urdma_zalloc(SIZE_MAX - 10) == NULL);

	/* urdma_ring_move: a wrapped ring comes out in order, from a head
	 * taken modulo the capacity (a free-running 32-bit index too). */
	static const uint32_t heads[] = { 0, 5, 7, 0xfffffffdu };
	for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
		uint32_t *r = urdma_zalloc_array(8, sizeof(*r)), *m;

		CHECK(r != NULL);
		if (!r)
			continue;
		for (uint32_t i = 0; i < 6; i++)
			r[(heads[h] + i) % 8] = 100 + i;
		m = urdma_ring_move(r, 8, heads[h], 6, 16, sizeof(*r));
		CHECK(m != NULL);
		for (uint32_t i = 0; m && i < 16; i++)
			CHECK(m[i] == (i < 6 ? 100 + i : 0));
		urdma_free(m);
	}
}

/* The first device, opened (NULL if there is none); dev_close undoes it. */
static struct ibv_context *dev_open(struct ibv_device ***list)
{
	*list = ibv_get_device_list(NULL);
	return *list && (*list)[0] ? ibv_open_device((*list)[0]) : NULL;
}

static void dev_close(struct ibv_context *ctx, struct ibv_device **list)
{
	if (ctx)
		ibv_close_device(ctx);
	if (list)
		ibv_free_device_list(list);
}

/*
 * Waking a peer process (a byte on our connection to its context) after it
 * died: the write finds no reader.  That must not raise SIGPIPE and kill
 * the waker (rping's client, status 141, when its server was killed
 * between the death and our progress thread seeing it), and the hang-up
 * must mark the peer dead.
 */
static void test_wake_dead_peer(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = dev_open(&list);
	int fds[2];
	uint32_t id = 0;
	pid_t pid;

	CHECK(ctx != NULL);
	if (!ctx || pipe(fds))
		goto out;
	pid = fork();
	if (pid == 0) {
		struct ibv_context *c = ibv_open_device(list[0]);

		if (c)
			id = to_uctx(c)->ctx_id;
		if (write(fds[1], &id, sizeof(id)) != sizeof(id))
			_exit(1);
		for (;;)
			pause();
	}
	close(fds[1]); /* a child that dies first ends the read */
	CHECK(pid > 0 && read(fds[0], &id, sizeof(id)) == sizeof(id) && id);
	if (pid > 0 && id) {
		struct urdma_peer *p = urdma_peer_get(id);

		CHECK(p != NULL);
		if (p) {
			CHECK(urdma_peer_wait(p, 5000) == 0); /* the hello */
			CHECK(urdma_peer_pid(p) == pid);
			CHECK(urdma_peer_wake(p) == 0);
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			pid = 0;
			urdma_peer_wake(p); /* dead: no SIGPIPE */
			for (int i = 0; i < 500 && !urdma_peer_dead(p); i++)
				usleep(10000);
			CHECK(urdma_peer_dead(p));
			urdma_peer_put(p);
		}
	}
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	close(fds[0]);
out:
	dev_close(ctx, list);
}

/*
 * A CQ's shared block is reused once the CQ is gone (its QPs waited for
 * their deliverers, core/bell.c): a block quarantined at each destroy
 * cost 12 KiB of the arena's 64 GiB per CQ, and rdma_cm makes two per
 * connection.  Unless a QP of it gave up waiting: then never.
 */
static void test_cq_block_reuse(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = dev_open(&list);
	struct ibv_cq *cq;
	uint64_t va;

	CHECK(ctx != NULL);
	if (!ctx)
		goto out;
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq != NULL);
	if (!cq)
		goto out;
	va = to_ucq(cq)->shm_va;
	CHECK(!ibv_destroy_cq(cq));
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq && to_ucq(cq)->shm_va == va); /* (first fit) */
	if (!cq)
		goto out;
	atomic_store(&to_ucq(cq)->shm_busy_left, true);
	CHECK(!ibv_destroy_cq(cq));
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq && to_ucq(cq)->shm_va != va);
	if (cq)
		ibv_destroy_cq(cq);
out:
	dev_close(ctx, list);
}

/* A CQ's readiness set (cq_watch.c): a CQ that polls more than
 * URDMA_CQ_POLLERS QPs names a watched socket when it is readable, and
 * no longer once unwatched; a CQ that polls fewer watches nothing. */
static void test_cq_watch(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = dev_open(&list);
	struct urdma_qp qp = { 0 }, *got[URDMA_CQ_POLLERS];
	struct ibv_cq *ibcq = NULL;
	struct urdma_cq *cq;
	int sv[2] = { -1, -1 };

	CHECK(ctx != NULL);
	if (!ctx)
		goto out;
	ibcq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(ibcq && !socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
	if (!ibcq || sv[0] < 0)
		goto out;
	cq = to_ucq(ibcq);
	qp.rcq = qp.scq = cq;
	atomic_store(&cq->polled_qps, URDMA_CQ_POLLERS); /* not more */
	urdma_cq_watch_fd(&qp, sv[0]);
	CHECK(atomic_load(&qp.fd_watch) == 0 && cq->watch_epfd < 0);
	atomic_store(&cq->polled_qps, URDMA_CQ_POLLERS + 1);
	urdma_cq_watch_fd(&qp, sv[0]);
	CHECK(atomic_load(&qp.fd_watch) == URDMA_WATCH_RCQ &&
	      urdma_cq_watches(cq, &qp));
	urdma_cq_watch_fd(&qp, sv[0]); /* (once) */
	CHECK(atomic_load(&qp.fd_watch) == URDMA_WATCH_RCQ);
	pthread_mutex_lock(&cq->lock);
	CHECK(urdma_cq_ready(cq, got, URDMA_CQ_POLLERS) == 0);
	CHECK(write(sv[1], "x", 1) == 1);
	CHECK(urdma_cq_ready(cq, got, URDMA_CQ_POLLERS) == 1 && got[0] == &qp);
	pthread_mutex_unlock(&cq->lock);
	urdma_cq_unwatch_fd(&qp, sv[0]);
	CHECK(atomic_load(&qp.fd_watch) == 0 && !urdma_cq_watches(cq, &qp));
	pthread_mutex_lock(&cq->lock);
	CHECK(urdma_cq_ready(cq, got, URDMA_CQ_POLLERS) == 0); /* readable */
	pthread_mutex_unlock(&cq->lock);
	atomic_store(&cq->polled_qps, 0);
out:
	if (sv[0] >= 0) {
		close(sv[0]);
		close(sv[1]);
	}
	if (ibcq)
		CHECK(!ibv_destroy_cq(ibcq));
	dev_close(ctx, list);
}

/* urdma_poll_fd: a look at an fd with nothing to read says 0 however
 * many signals land in it (poll() says -1 EINTR for those, even with a
 * timeout of 0: peer.c took that for a dead peer).  A thread sends
 * SIGUSR1 (SA_RESTART) to this one as fast as it can meanwhile. */
static atomic_bool storm_on;

static void storm_handler(int sig)
{
	(void)sig;
}

static void *storm(void *arg)
{
	pthread_t to = *(pthread_t *)arg;

	while (atomic_load(&storm_on))
		pthread_kill(to, SIGUSR1);
	return NULL;
}

static void test_poll_fd(void)
{
	struct sigaction sa = { .sa_handler = storm_handler, .sa_flags = SA_RESTART }, old;
	pthread_t self = pthread_self(), t;
	int fds[2], raw_eintr = 0, nonzero = 0;

	CHECK(!pipe(fds));
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, &old);
	atomic_store(&storm_on, true);
	CHECK(!pthread_create(&t, NULL, storm, &self));
	for (int i = 0; i < 20000; i++) {
		struct pollfd p = { .fd = fds[0], .events = POLLIN };

		raw_eintr += poll(&p, 1, 0) < 0 && errno == EINTR;
		nonzero += urdma_poll_fd(fds[0], POLLIN, 0) != 0;
	}
	CHECK(urdma_poll_fd(fds[0], POLLIN, 20) == 0); /* waits its time */
	atomic_store(&storm_on, false);
	pthread_join(t, NULL);
	sigaction(SIGUSR1, &old, NULL);
	CHECK(raw_eintr > 0); /* (the storm reached the system call) */
	CHECK(nonzero == 0);
	CHECK(write(fds[1], "x", 1) == 1);
	CHECK(urdma_poll_fd(fds[0], POLLIN, 0) == 1);
	close(fds[0]);
	close(fds[1]);
}

int main(void)
{
	test_alloc();
	test_crc32c();
	test_mr_lookup();
	test_copy_spans();
	test_backing();
	test_roundup();
	test_wake_dead_peer();
	test_cq_block_reuse();
	test_cq_watch();
	test_poll_fd();
	printf("%d passed, %d failed\n", checks - failures, failures);
	return failures ? 1 : 0;
}
