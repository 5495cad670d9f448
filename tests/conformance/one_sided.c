/* SPDX-License-Identifier: MIT */
/*
 * Conformance: one-sided operations (RDMA WRITE, WRITE_WITH_IMM, READ,
 * atomics) between two processes.
 *
 * The parent is the initiator, the child the target.  While one-sided
 * operations run, the target calls nothing at all: it sleeps in a blocking
 * read on the socketpair (or spins on its own memory, like ib_write_lat),
 * so the data must reach its memory without its help.
 *
 * Over 1,000 lines on purpose: a catalogue of independent cases sharing one
 * parent/child set-up; main() at the end lists them by name.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MiB (1024 * 1024)
#define GUARD 4096 /* canary bytes on each side of the target region */
#define CANARY 0xC5

/* The target's buffer: [GUARD canary][region][GUARD canary]; only the
 * region is registered. */
struct target {
	struct t_res r;
	unsigned char *mem;
	unsigned char *region;
	size_t len;
	struct ibv_mr *mr;
};

static void target_open(struct target *t, size_t len, unsigned access)
{
	t_res_open(&t->r, NULL);
	t->len = len;
	t->mem = t_alloc(len + 2 * GUARD);
	memset(t->mem, CANARY, len + 2 * GUARD);
	t->region = t->mem + GUARD;
	memset(t->region, 0, len);
	t->mr = t_reg(&t->r, t->region, len, access);
}

static bool guards_intact(struct target *t)
{
	for (size_t i = 0; i < GUARD; i++) {
		if (!CHECK(t->mem[i] == CANARY, "canary before the region overwritten at -%zu",
			   GUARD - i))
			return false;
		if (!CHECK(t->region[t->len + i] == CANARY,
			   "canary after the region overwritten at +%zu", i))
			return false;
	}
	return true;
}

static void target_close(struct target *t)
{
	guards_intact(t);
	t_res_close(&t->r);
	free(t->mem);
}

struct initiator {
	struct t_res r;
	unsigned char *buf;
	size_t len;
	struct ibv_mr *mr;
	struct t_conn remote;
};

static void initiator_open(struct initiator *in, size_t len, const struct t_opts *o)
{
	t_res_open(&in->r, o);
	in->len = len;
	in->buf = t_alloc(len);
	in->mr = t_reg(&in->r, in->buf, len, IBV_ACCESS_LOCAL_WRITE);
}

static void initiator_close(struct initiator *in)
{
	t_res_close(&in->r);
	free(in->buf);
}

/* A message from the initiator to the target: what to verify. */
struct verify_msg {
	uint64_t op; /* 0 = done, 1 = verify pattern */
	uint64_t off, len, seed;
};

static void send_verify(struct t_peer *p, uint64_t off, uint64_t len, uint64_t seed)
{
	struct verify_msg m = {1, off, len, seed};
	t_send_msg(p, &m, sizeof(m));
	(void)t_recv_u64(p, T_WAIT_MS); /* verified */
}

static void send_done(struct t_peer *p)
{
	struct verify_msg m = {0, 0, 0, 0};
	t_send_msg(p, &m, sizeof(m));
}

/* Target side loop: sleep in a blocking read until told what to check. */
static void target_verify_loop(struct t_peer *p, struct target *t)
{
	for (;;) {
		struct verify_msg m;
		t_recv_msg(p, &m, sizeof(m), 30000);
		if (m.op == 0)
			break;
		long bad = t_pattern_check(t->region + m.off, m.len, (unsigned)m.seed);
		CHECK(bad < 0, "written data (offset %llu, %llu bytes) differs at byte %ld: 0x%02x, "
		      "expected 0x%02x", (unsigned long long)m.off, (unsigned long long)m.len, bad,
		      bad >= 0 ? t->region[m.off + (size_t)bad] : 0,
		      bad >= 0 ? t_pattern_byte((size_t)bad, (unsigned)m.seed) : 0);
		t_send_u64(p, 1);
	}
}

static const uint32_t wsizes[] = {1, 7, 64, 4096, 4097, 65536, 65537, MiB};
#define NW (sizeof(wsizes) / sizeof(wsizes[0]))

/* ---- RDMA WRITE of various sizes, target asleep in read() ---- */

static void write_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, MiB + 64, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	for (size_t i = 0; i < NW; i++) {
		uint64_t off = (i * 13) % 61; /* odd, unaligned remote offsets */
		if (off + wsizes[i] > in.remote.len)
			off = in.remote.len - wsizes[i];
		t_pattern_fill(in.buf + 5, wsizes[i], 200u + (unsigned)i);
		int ret = t_post_send(in.r.qp, i, IBV_WR_RDMA_WRITE, in.buf + 5, wsizes[i],
				      in.mr->lkey, IBV_SEND_SIGNALED, in.remote.addr + off,
				      in.remote.rkey);
		REQUIRE(ret == 0, "post RDMA_WRITE of %u bytes: %d", wsizes[i], ret);
		char what[64];
		snprintf(what, sizeof(what), "RDMA_WRITE of %u bytes", wsizes[i]);
		t_expect_wc(in.r.send_cq, NULL, i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, what);
		/* A completed WRITE is in the target's memory: verify it. */
		send_verify(p, off, wsizes[i], 200u + (unsigned)i);
	}
	send_done(p);
	t_barrier(p);
	initiator_close(&in);
}

static void write_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, MiB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	target_verify_loop(p, &t);
	t_barrier(p);
	target_close(&t);
}

/* ---- WRITE with a gather list of local SGEs into one remote range ---- */

static void write_sge_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_send_sge = 4;
	struct initiator in;
	t_res_open(&in.r, &o);
	in.len = 65536;
	in.buf = t_alloc(in.len);
	in.mr = t_reg(&in.r, in.buf, in.len, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(in.r.cap.max_send_sge >= 4, "max_send_sge %u", in.r.cap.max_send_sge);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	static const uint32_t piece[4] = {1, 4095, 3, 9000};
	static const size_t where[4] = {0, 100, 8000, 20001};
	struct ibv_sge sge[4];
	size_t pos = 0;
	for (int i = 0; i < 4; i++) {
		for (uint32_t b = 0; b < piece[i]; b++, pos++)
			in.buf[where[i] + b] = t_pattern_byte(pos, 77);
		sge[i] = (struct ibv_sge){.addr = (uintptr_t)(in.buf + where[i]), .length = piece[i],
					  .lkey = in.mr->lkey};
	}
	struct ibv_send_wr wr = {.wr_id = 9, .sg_list = sge, .num_sge = 4,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = in.remote.addr + 3;
	wr.wr.rdma.rkey = in.remote.rkey;
	struct ibv_send_wr *bad;
	REQUIRE(ibv_post_send(in.r.qp, &wr, &bad) == 0, "post RDMA_WRITE with 4 SGEs");
	t_expect_wc(in.r.send_cq, NULL, 9, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "gathered WRITE");
	send_verify(p, 3, pos, 77);
	send_done(p);
	t_barrier(p);
	initiator_close(&in);
}

/* ---- The target spins on its own memory, never calling verbs ---- */

#define SPIN_LEN (256 * 1024)

static void spin_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, SPIN_LEN, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	t_pattern_fill(in.buf, SPIN_LEN, 5);
	REQUIRE(in.buf[SPIN_LEN - 1] != 0, "pattern must end in a non-zero byte");
	t_sleep_ms(50); /* let the target start spinning */
	int ret = t_post_send(in.r.qp, 1, IBV_WR_RDMA_WRITE, in.buf, SPIN_LEN, in.mr->lkey,
			      IBV_SEND_SIGNALED, in.remote.addr, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_WRITE: %d", ret);
	t_expect_wc(in.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "RDMA_WRITE");
	t_barrier(p);
	initiator_close(&in);
}

static void spin_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, SPIN_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	/* No verbs call from here until the data is there: like
	 * ib_write_lat, watch the last byte; then the whole buffer (the
	 * spec does not order the bytes within one WRITE, so keep
	 * looking until all of it is there or the deadline passes). */
	volatile unsigned char *last = t.region + SPIN_LEN - 1;
	uint64_t end = t_now_ms() + T_WAIT_MS;
	bool seen = false;
	while (t_now_ms() < end) {
		if (*last == t_pattern_byte(SPIN_LEN - 1, 5) &&
		    t_pattern_check(t.region, SPIN_LEN, 5) < 0) {
			seen = true;
			break;
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
	}
	long bad = t_pattern_check(t.region, SPIN_LEN, 5);
	CHECK(seen, "the WRITE did not appear in the target's memory within %d ms while the target "
	      "made no verbs call (first wrong byte at %ld)", T_WAIT_MS, bad);
	t_barrier(p);
	target_close(&t);
}

/*
 * The target polls its CQ, finds nothing, and turns to spinning on memory
 * (as ib_write_lat does between its Write and the peer's): a transport
 * that stopped watching for data while the application polled must look
 * again soon.  Over TCP that look comes within 2 ms; before it was asked
 * for, it waited for the progress thread's long sleep to end (50 ms).  The
 * median of the rounds must stay well below that.  The same when the poll
 * loop ended by receiving a Send (LOOK_RECEIVED): the stream then stays
 * parked for the target's next send, which does not come, until the
 * transport finds the target spinning (first round; after it the stream
 * goes back at once, as below).
 *
 * Or the target pauses after that Send, calling nothing, with nothing
 * coming, and spins only then (LOOK_PAUSED): the transport gives the
 * stream back meanwhile, but must not take the pause for spinning (it
 * would unpark after every receiving poll from then on, two system calls
 * per round trip); tests/net/conformance.sh checks its debug log for that.
 *
 * Or the poll loop ends by receiving a Write (the data) and the target
 * spins for a second Write (the flag) that the initiator posts only then
 * (LOOK_PLACED).  Over TCP such a poll keeps the stream parked for the
 * target's next send, as ib_write_lat wants, until the transport finds
 * the target spinning instead (in the first round, within 2 ms); from then
 * on this connection's stream goes back to the progress thread at once,
 * and the flag takes microseconds.  Measured, rounds over 500 us: 0 to 3
 * of 41 on an idle host, up to 11 with two busy loops on its two CPUs
 * (21 rounds, the check once failed there with 11 of 21); 30 to 36 of 41
 * when every such poll kept the park (each waited for the transport's
 * next look, up to 2 ms).  The slow rounds besides the first are there
 * without the park too (0 to 6 of 21 when a Write never kept it): the
 * data came through the progress thread just before the poll loop parked
 * the stream.  With more busy threads than CPUs the flag waits for a CPU
 * instead: 8 to 25 of 41 with three busy loops here (medians up to 3 ms,
 * a scheduler's time slice), and a shared host's busy spell can do the
 * same (21 to 23 of 41 in 3 of 15 runs one evening).  So a set over the
 * bound is followed by a second set, which decides: a transport that
 * keeps the park fails both.
 */
#define LOOK_ROUNDS 41
#define LOOK_BOUND_US 10000
#define LOOK_PLACED_SLOW_US 500
#define LOOK_PLACED_SLOW_MAX 20
/* Well past the transport's look (within 2 ms of the pause's start), even
 * on a loaded host; fewer rounds for it. */
#define LOOK_PAUSE_MS 50
#define LOOK_PAUSED_ROUNDS 11
enum { LOOK_POLLED, LOOK_RECEIVED, LOOK_PAUSED, LOOK_PLACED };

static uint64_t look_rounds(void *arg)
{
	return arg == (void *)LOOK_PAUSED ? LOOK_PAUSED_ROUNDS : LOOK_ROUNDS;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The median of n delays (us) must stay under bound; what names them. */
static void check_median(uint64_t *us, int n, uint64_t bound, const char *what)
{
	qsort(us, n, sizeof(us[0]), cmp_u64);
	t_note("%s: median %llu us, max %llu us", what, (unsigned long long)us[n / 2],
	       (unsigned long long)us[n - 1]);
	CHECK(us[n / 2] < bound, "%s: median %llu us, bound %llu us", what,
	      (unsigned long long)us[n / 2], (unsigned long long)bound);
}

static int count_over(const uint64_t *us, int n, uint64_t slow)
{
	int over = 0;

	for (int i = 0; i < n; i++)
		over += us[i] > slow;
	return over;
}

/* At most most of n delays (us) may be over slow us; what names them. */
static void check_slow(const uint64_t *us, int n, uint64_t slow, int most, const char *what)
{
	int over = count_over(us, n, slow);

	t_note("%s: %d of %d over %llu us", what, over, n, (unsigned long long)slow);
	CHECK(over <= most, "%s: %d of %d over %llu us, at most %d allowed", what, over, n,
	      (unsigned long long)slow, most);
}

static void look_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 64, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	for (uint64_t i = 1;; i++) {
		int ret;

		/* The target polls or spins; 0: no more rounds */
		if (!t_recv_u64(p, T_WAIT_MS))
			break;
		if (arg == (void *)LOOK_PLACED) {
			/* The data, then the flag once the target spins */
			memcpy(in.buf + 8, &i, sizeof(i));
			ret = t_post_send(in.r.qp, 100 + i, IBV_WR_RDMA_WRITE, in.buf + 8,
					  sizeof(i), in.mr->lkey, 0, in.remote.addr + 16,
					  in.remote.rkey);
			REQUIRE(ret == 0, "post RDMA_WRITE (data): %d", ret);
			(void)t_recv_u64(p, T_WAIT_MS);
		} else if (arg != (void *)LOOK_POLLED) {
			/* A Send for the target's poll loop, the Write behind it */
			memcpy(in.buf + 8, &i, sizeof(i));
			ret = t_post_send(in.r.qp, 100 + i, IBV_WR_SEND, in.buf + 8, sizeof(i),
					  in.mr->lkey, 0, 0, 0);
			REQUIRE(ret == 0, "post SEND: %d", ret);
		}
		if (arg == (void *)LOOK_PAUSED)
			(void)t_recv_u64(p, T_WAIT_MS); /* paused, spins now */
		else if (arg != (void *)LOOK_PLACED)
			t_sleep_ms(1);
		memcpy(in.buf, &i, sizeof(i));
		uint64_t posted = t_now_us();
		ret = t_post_send(in.r.qp, i, IBV_WR_RDMA_WRITE, in.buf, sizeof(i), in.mr->lkey,
				  IBV_SEND_SIGNALED, in.remote.addr, in.remote.rkey);
		REQUIRE(ret == 0, "post RDMA_WRITE: %d", ret);
		t_send_u64(p, posted);
		/* Leave a CPU to the target's progress thread meanwhile. */
		if (arg == (void *)LOOK_PLACED)
			t_sleep_ms(3);
		if (!t_expect_wc(in.r.send_cq, NULL, i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
				 "RDMA_WRITE"))
			break;
	}
	t_barrier(p);
	initiator_close(&in);
}

static void look_child(struct t_peer *p, void *arg)
{
	struct target t;
	struct ibv_wc wc;
	uint64_t delay[LOOK_ROUNDS];
	int n = 0;

	target_open(&t, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	volatile uint64_t *v = (volatile uint64_t *)t.region;
	volatile uint64_t *data = (volatile uint64_t *)(t.region + 16);
	uint64_t last = look_rounds(arg);
	for (uint64_t i = 1; i <= last; i++) {
		/* Idle long enough for the transport to have looked at the
		 * stream since the last round; then a poll loop that finds
		 * nothing, and off to spin. */
		t_sleep_ms(5);
		if (arg == (void *)LOOK_PLACED) {
			/* A poll loop that ends when the data is in memory. */
			t_send_u64(p, i);
			uint64_t end = t_now_ms() + T_WAIT_MS;
			int got = 0;
			while (*data != i && t_now_ms() < end)
				got += ibv_poll_cq(t.r.recv_cq, 1, &wc);
			if (!CHECK(*data == i && got == 0, "round %llu: the data WRITE did not "
				   "reach the polling target (%d completions)",
				   (unsigned long long)i, got))
				break;
			t_send_u64(p, i); /* spinning for the flag */
		} else if (arg != (void *)LOOK_POLLED) {
			/* A poll loop that receives a Send, then off to spin
			 * (after a pause in which nothing comes: LOOK_PAUSED). */
			REQUIRE(t_post_recv(t.r.qp, 100 + i, t.region + 32, 8, t.mr->lkey) == 0,
				"post_recv");
			t_send_u64(p, i);
			uint64_t end = t_now_ms() + T_WAIT_MS;
			int got;
			while (!(got = ibv_poll_cq(t.r.recv_cq, 1, &wc)) && t_now_ms() < end)
				; /* like perftest: no yield, no sleep */
			if (!CHECK(got == 1 && wc.status == IBV_WC_SUCCESS &&
				   wc.wr_id == 100 + i, "round %llu: no RECV (%d, %s)",
				   (unsigned long long)i, got, t_wc_status_str(wc.status)))
				break;
			if (arg == (void *)LOOK_PAUSED) {
				t_sleep_ms(LOOK_PAUSE_MS);
				t_send_u64(p, i);
			}
		} else {
			int got = 0;
			for (int k = 0; k < 20; k++)
				got += ibv_poll_cq(t.r.recv_cq, 1, &wc);
			CHECK(got == 0, "the target's CQ had %d completions", got);
			t_send_u64(p, i);
		}
		uint64_t end = t_now_ms() + T_WAIT_MS;
		while (*v != i && t_now_ms() < end)
			;
		uint64_t seen = t_now_us();
		uint64_t posted = t_recv_u64(p, T_WAIT_MS);
		if (!CHECK(*v == i, "round %llu: the WRITE did not reach the spinning target "
			   "in %d ms", (unsigned long long)i, T_WAIT_MS))
			break;
		delay[n++] = seen > posted ? seen - posted : 0;
		int over = i == LOOK_ROUNDS && arg == (void *)LOOK_PLACED ?
				   count_over(delay, n, LOOK_PLACED_SLOW_US) : 0;
		if (over > LOOK_PLACED_SLOW_MAX) {
			t_note("first set: %d of %d over %d us: a second set decides", over,
			       n, LOOK_PLACED_SLOW_US);
			last += LOOK_ROUNDS;
			n = 0;
		}
	}
	t_send_u64(p, 0); /* no more rounds */
	const char *what =
		arg == (void *)LOOK_PLACED ?
			"flag WRITE seen by a target that polled until the data WRITE came, "
			"then spun" :
		arg == (void *)LOOK_RECEIVED ?
			"WRITE seen by a target that received a Send, then spun" :
		arg == (void *)LOOK_PAUSED ?
			"WRITE seen by a target that received a Send, paused, then spun" :
			"WRITE seen by a target that polled, then spun";
	if (n == (int)look_rounds(arg) && arg == (void *)LOOK_PLACED)
		check_slow(delay, n, LOOK_PLACED_SLOW_US, LOOK_PLACED_SLOW_MAX, what);
	if (n == (int)look_rounds(arg))
		check_median(delay, n, LOOK_BOUND_US, what);
	t_barrier(p);
	target_close(&t);
}

/*
 * A signaled WRITE completes when the target answers the zero-length Read
 * that follows it over TCP (docs/wire-protocol.md).  The target holds that
 * answer back for a message of its own; a target that polls its CQ now
 * and then but never sends must still answer soon: within 2 ms by design
 * (50 us when the progress thread took the WRITE).  Without a due time the
 * answer waited for the progress thread's idle pass (up to 200 ms).  With
 * both CPUs busy the median measured 2.9 ms: the bound leaves room.
 */
#define HOLD_ROUNDS 21
#define HOLD_BOUND_US 20000
/* A target that polls every 8 us (arg HOLD_OFTEN): its polls, not the
 * progress thread, take most WRITEs, and each held the answer 2 ms until
 * two polls without a message, however far apart, send it: 84-204 of 300
 * WRITEs took over 1 ms before, 1 of 300 after. */
#define HOLD_OFTEN ((void *)1)
#define HOLD_OFTEN_ROUNDS 200
#define HOLD_OFTEN_SLOW_US 1000
#define HOLD_OFTEN_SLOW_MAX 20

static void hold_parent(struct t_peer *p, void *arg)
{
	int rounds = arg == HOLD_OFTEN ? HOLD_OFTEN_ROUNDS : HOLD_ROUNDS;
	struct initiator in;
	uint64_t took[HOLD_OFTEN_ROUNDS];
	int n = 0;

	initiator_open(&in, 64, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	t_barrier(p); /* the target polls */
	for (uint64_t i = 1; i <= (uint64_t)rounds; i++) {
		memcpy(in.buf, &i, sizeof(i));
		uint64_t t0 = t_now_us();
		int ret = t_post_send(in.r.qp, i, IBV_WR_RDMA_WRITE, in.buf, sizeof(i),
				      in.mr->lkey, IBV_SEND_SIGNALED, in.remote.addr,
				      in.remote.rkey);
		REQUIRE(ret == 0, "post RDMA_WRITE: %d", ret);
		if (!t_expect_wc(in.r.send_cq, NULL, i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
				 "RDMA_WRITE"))
			break;
		took[n++] = t_now_us() - t0;
		if (arg != HOLD_OFTEN)
			t_sleep_ms(1);
	}
	t_send_u64(p, 0); /* done */
	if (n == rounds && arg == HOLD_OFTEN)
		check_slow(took, n, HOLD_OFTEN_SLOW_US, HOLD_OFTEN_SLOW_MAX,
			   "signaled WRITE to a target that polls every 8 us, never sends");
	if (n == rounds)
		check_median(took, n, HOLD_BOUND_US,
			     "signaled WRITE to a target that polls but never sends, completed");
	t_barrier(p);
	initiator_close(&in);
}

static void hold_child(struct t_peer *p, void *arg)
{
	struct target t;
	struct ibv_wc wc;
	struct timespec nap = { 0, 100000 };

	target_open(&t, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	t_barrier(p);
	/* Poll every 100 us or so (HOLD_OFTEN: 8 us, not asleep), never send,
	 * until the initiator is done. */
	while (!t_fd_readable(p->fd, 0)) {
		CHECK(ibv_poll_cq(t.r.recv_cq, 1, &wc) == 0, "a completion at the target");
		if (arg == HOLD_OFTEN) {
			uint64_t t0 = t_now_us();

			while (t_now_us() - t0 < 8)
				;
		} else {
			nanosleep(&nap, NULL);
		}
	}
	(void)t_recv_u64(p, T_WAIT_MS);
	t_barrier(p);
	target_close(&t);
}

/* ---- RDMA_WRITE_WITH_IMM consumes a receive at the target ---- */

static void wimm_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 8192, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	t_barrier(p); /* receives posted */
	t_pattern_fill(in.buf, 4096, 31);
	struct ibv_sge sge = {.addr = (uintptr_t)in.buf, .length = 4096, .lkey = in.mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				 .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xCAFEF00D)};
	wr.wr.rdma.remote_addr = in.remote.addr + 100;
	wr.wr.rdma.rkey = in.remote.rkey;
	struct ibv_send_wr *bad;
	REQUIRE(ibv_post_send(in.r.qp, &wr, &bad) == 0, "post RDMA_WRITE_WITH_IMM");
	t_expect_wc(in.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "RDMA_WRITE_WITH_IMM");
	/* Zero-length WRITE_WITH_IMM: only the immediate travels. */
	wr.wr_id = 2;
	wr.num_sge = 0;
	wr.imm_data = htonl(0x0BADBEEF);
	REQUIRE(ibv_post_send(in.r.qp, &wr, &bad) == 0, "post zero-length RDMA_WRITE_WITH_IMM");
	t_expect_wc(in.r.send_cq, NULL, 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
		    "zero-length RDMA_WRITE_WITH_IMM");
	/* A plain SEND takes the next receive. */
	in.buf[0] = 42;
	REQUIRE(t_post_send(in.r.qp, 3, IBV_WR_SEND, in.buf, 1, in.mr->lkey, IBV_SEND_SIGNALED, 0,
			    0) == 0, "post SEND");
	t_expect_wc(in.r.send_cq, NULL, 3, IBV_WC_SUCCESS, IBV_WC_SEND, "SEND");
	t_barrier(p);
	t_barrier(p);
	initiator_close(&in);
}

static void wimm_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	/* The receives for the immediates need no buffer; the last one
	 * (for the SEND) has one, away from the written range. */
	REQUIRE(t_post_recv(t.r.qp, 10, NULL, 0, 0) == 0, "ibv_post_recv (no SGE)");
	REQUIRE(t_post_recv(t.r.qp, 11, NULL, 0, 0) == 0, "ibv_post_recv (no SGE)");
	REQUIRE(t_post_recv(t.r.qp, 12, t.region + 6000, 64, t.mr->lkey) == 0, "ibv_post_recv");
	t_barrier(p);
	t_barrier(p); /* asleep until all three operations completed */
	struct ibv_wc wc;
	if (t_expect_wc(t.r.recv_cq, &wc, 10, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
			"receive consumed by RDMA_WRITE_WITH_IMM")) {
		CHECK(wc.byte_len == 4096, "RDMA_WRITE_WITH_IMM: byte_len %u, expected 4096",
		      wc.byte_len);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM, "RDMA_WRITE_WITH_IMM: IBV_WC_WITH_IMM not set");
		CHECK(ntohl(wc.imm_data) == 0xCAFEF00D, "imm_data 0x%08x", ntohl(wc.imm_data));
	}
	long bad = t_pattern_check(t.region + 100, 4096, 31);
	CHECK(bad < 0, "RDMA_WRITE_WITH_IMM data differs at %ld", bad);
	if (t_expect_wc(t.r.recv_cq, &wc, 11, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
			"receive consumed by the zero-length RDMA_WRITE_WITH_IMM")) {
		CHECK(wc.byte_len == 0, "zero-length RDMA_WRITE_WITH_IMM: byte_len %u", wc.byte_len);
		CHECK(ntohl(wc.imm_data) == 0x0BADBEEF, "imm_data 0x%08x", ntohl(wc.imm_data));
	}
	if (t_expect_wc(t.r.recv_cq, &wc, 12, IBV_WC_SUCCESS, IBV_WC_RECV, "receive of the SEND"))
		CHECK(wc.byte_len == 1 && t.region[6000] == 42, "SEND: byte_len %u data %u",
		      wc.byte_len, t.region[6000]);
	t_barrier(p);
	target_close(&t);
}

/* ---- RDMA READ ---- */

static void read_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_send_sge = 3;
	struct initiator in;
	t_res_open(&in.r, &o);
	in.len = MiB + 64;
	in.buf = t_alloc(in.len);
	in.mr = t_reg(&in.r, in.buf, in.len, IBV_ACCESS_LOCAL_WRITE);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	/* The target filled its region with pattern 9. */
	for (size_t i = 0; i < NW; i++) {
		uint64_t off = (i * 29) % 53;
		if (off + wsizes[i] > in.remote.len)
			off = in.remote.len - wsizes[i];
		memset(in.buf, 0, wsizes[i] + 16);
		int ret = t_post_send(in.r.qp, i, IBV_WR_RDMA_READ, in.buf + 1, wsizes[i], in.mr->lkey,
				      IBV_SEND_SIGNALED, in.remote.addr + off, in.remote.rkey);
		REQUIRE(ret == 0, "post RDMA_READ of %u bytes: %d", wsizes[i], ret);
		char what[64];
		snprintf(what, sizeof(what), "RDMA_READ of %u bytes", wsizes[i]);
		if (t_expect_wc(in.r.send_cq, NULL, i, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, what)) {
			long bad = -1;
			for (uint32_t k = 0; k < wsizes[i]; k++)
				if (in.buf[1 + k] != t_pattern_byte(off + k, 9)) {
					bad = k;
					break;
				}
			CHECK(bad < 0, "%s: data differs at %ld", what, bad);
			CHECK(in.buf[0] == 0 && in.buf[1 + wsizes[i]] == 0,
			      "%s wrote outside the local SGE", what);
		}
	}
	/* A READ scattered into three local SGEs. */
	memset(in.buf, 0, 4096);
	struct ibv_sge sge[3] = {
		{.addr = (uintptr_t)(in.buf + 0), .length = 10, .lkey = in.mr->lkey},
		{.addr = (uintptr_t)(in.buf + 100), .length = 1000, .lkey = in.mr->lkey},
		{.addr = (uintptr_t)(in.buf + 2000), .length = 33, .lkey = in.mr->lkey},
	};
	struct ibv_send_wr wr = {.wr_id = 77, .sg_list = sge, .num_sge = 3,
				 .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.remote_addr = in.remote.addr + 500;
	wr.wr.rdma.rkey = in.remote.rkey;
	struct ibv_send_wr *badwr;
	if (CHECK(in.r.cap.max_send_sge >= 3, "max_send_sge %u", in.r.cap.max_send_sge) &&
	    CHECK(ibv_post_send(in.r.qp, &wr, &badwr) == 0, "post scattered RDMA_READ") &&
	    t_expect_wc(in.r.send_cq, NULL, 77, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "scattered READ")) {
		size_t pos = 500;
		bool ok = true;
		for (int s = 0; s < 3 && ok; s++)
			for (uint32_t k = 0; k < sge[s].length && ok; k++, pos++)
				ok = ((unsigned char *)(uintptr_t)sge[s].addr)[k] == t_pattern_byte(pos, 9);
		CHECK(ok, "scattered READ: data differs at remote offset %zu", pos - 1);
		CHECK(in.buf[10] == 0 && in.buf[99] == 0 && in.buf[1100] == 0,
		      "scattered READ wrote between the SGEs");
	}
	t_barrier(p);
	initiator_close(&in);
}

static void read_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, MiB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	t_pattern_fill(t.region, MiB, 9);
	t_connect_pair(p, &t.r, t.mr, NULL);
	t_barrier_timeout(p, 30000); /* asleep while the parent reads */
	CHECK(t_pattern_check(t.region, MiB, 9) < 0, "RDMA READ modified the target's memory");
	target_close(&t);
}

/* ---- A fenced READ after unsignaled Writes ----
 * IBV_SEND_FENCE waits for the READs and atomics before the WR, not for
 * Writes: over TCP an unsignaled Write stays unconfirmed until a later
 * response, and with timeout 0 (wait for ever) the fenced READ would then
 * never start. */
static void fence_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct initiator in;

	o.timeout = 0;
	initiator_open(&in, 4096, &o);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	t_pattern_fill(in.buf, 64, 5);
	for (int i = 0; i < 3; i++)
		REQUIRE(t_post_send(in.r.qp, 10 + i, IBV_WR_RDMA_WRITE, in.buf, 64, in.mr->lkey,
				    0, in.remote.addr + 64 * i, in.remote.rkey) == 0,
			"post unsignaled RDMA_WRITE");
	REQUIRE(t_post_send(in.r.qp, 20, IBV_WR_RDMA_READ, in.buf + 1024, 64, in.mr->lkey,
			    IBV_SEND_SIGNALED | IBV_SEND_FENCE, in.remote.addr + 128,
			    in.remote.rkey) == 0, "post fenced RDMA_READ");
	if (t_expect_wc(in.r.send_cq, NULL, 20, IBV_WC_SUCCESS, IBV_WC_RDMA_READ,
			"the fenced READ"))
		CHECK(!memcmp(in.buf + 1024, in.buf, 64), "the READ did not see the Write before it");
	t_barrier(p);
	initiator_close(&in);
}

static void fence_child(struct t_peer *p, void *arg)
{
	struct target t;

	target_open(&t, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				      IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	t_barrier_timeout(p, 30000);
	target_close(&t);
}

/* ---- Atomics ----
 * Values are 64-bit integers in the target's native byte order; the
 * original value lands in the initiator's buffer in native byte order too
 * (what rdma-core providers give on little-endian hosts). */

#define A0 0x0102030405060708ull

static void atomic_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 4096, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	uint64_t *res = (uint64_t *)(void *)in.buf;
	uint64_t slot0 = in.remote.addr, slot1 = in.remote.addr + 8, slot2 = in.remote.addr + 64;
	struct ibv_sge sge = {.addr = (uintptr_t)res, .length = 8, .lkey = in.mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;

	/* CMP_AND_SWP that matches: swaps, returns the old value. */
	*res = 0;
	wr.wr_id = 1;
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.remote_addr = slot0;
	wr.wr.atomic.rkey = in.remote.rkey;
	wr.wr.atomic.compare_add = A0;
	wr.wr.atomic.swap = 0xAAAABBBBCCCCDDDDull;
	REQUIRE(ibv_post_send(in.r.qp, &wr, &bad) == 0, "post CMP_AND_SWP");
	if (t_expect_wc(in.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, "CMP_AND_SWP (match)"))
		CHECK(*res == A0, "CMP_AND_SWP returned 0x%016llx, expected the old value 0x%016llx",
		      (unsigned long long)*res, A0);

	/* CMP_AND_SWP that does not match: no swap, returns the current value. */
	*res = 0;
	wr.wr_id = 2;
	wr.wr.atomic.compare_add = 12345;
	wr.wr.atomic.swap = 777;
	REQUIRE(ibv_post_send(in.r.qp, &wr, &bad) == 0, "post CMP_AND_SWP");
	if (t_expect_wc(in.r.send_cq, NULL, 2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP,
			"CMP_AND_SWP (no match)"))
		CHECK(*res == 0xAAAABBBBCCCCDDDDull, "CMP_AND_SWP (no match) returned 0x%016llx, "
		      "expected 0xaaaabbbbccccdddd", (unsigned long long)*res);

	/* FETCH_AND_ADD: returns the old value, adds (with carry across bytes). */
	*res = 0;
	wr.wr_id = 3;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = slot1;
	wr.wr.atomic.compare_add = 0x1;
	REQUIRE(ibv_post_send(in.r.qp, &wr, &bad) == 0, "post FETCH_AND_ADD");
	if (t_expect_wc(in.r.send_cq, NULL, 3, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, "FETCH_AND_ADD"))
		CHECK(*res == 0x00000000FFFFFFFFull, "FETCH_AND_ADD returned 0x%016llx, expected the "
		      "old value 0x00000000ffffffff", (unsigned long long)*res);

	/* 100 FETCH_AND_ADDs of 3, each result into its own slot. */
	uint64_t *many = (uint64_t *)(void *)(in.buf + 1024);
	for (int i = 0; i < 100; i++) {
		struct ibv_sge s2 = {.addr = (uintptr_t)&many[i], .length = 8, .lkey = in.mr->lkey};
		struct ibv_send_wr w2 = {.wr_id = 100u + (uint64_t)i, .sg_list = &s2, .num_sge = 1,
					 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
					 .send_flags = IBV_SEND_SIGNALED};
		w2.wr.atomic.remote_addr = slot2;
		w2.wr.atomic.rkey = in.remote.rkey;
		w2.wr.atomic.compare_add = 3;
		REQUIRE(ibv_post_send(in.r.qp, &w2, &bad) == 0, "post FETCH_AND_ADD #%d", i);
		t_expect_wc(in.r.send_cq, NULL, 100u + (uint64_t)i, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD,
			    "FETCH_AND_ADD");
		CHECK(many[i] == 1000u + 3u * (uint64_t)i, "FETCH_AND_ADD #%d returned %llu, expected %llu",
		      i, (unsigned long long)many[i], 1000ull + 3ull * (unsigned)i);
	}
	t_barrier(p);
	t_barrier(p);
	initiator_close(&in);
}

static void atomic_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	uint64_t *v = (uint64_t *)(void *)t.region;
	v[0] = A0;
	v[1] = 0x00000000FFFFFFFFull;
	v[8] = 1000;
	v[2] = 0x5555555555555555ull; /* a neighbour that must not change */
	t_connect_pair(p, &t.r, t.mr, NULL);
	t_barrier(p); /* asleep while the parent runs the atomics */
	CHECK(v[0] == 0xAAAABBBBCCCCDDDDull, "after CMP_AND_SWP the target holds 0x%016llx, "
	      "expected 0xaaaabbbbccccdddd", (unsigned long long)v[0]);
	CHECK(v[1] == 0x0000000100000000ull, "after FETCH_AND_ADD of 1 the target holds 0x%016llx, "
	      "expected 0x0000000100000000", (unsigned long long)v[1]);
	CHECK(v[8] == 1300, "after 100 FETCH_AND_ADDs of 3 the target holds %llu, expected 1300",
	      (unsigned long long)v[8]);
	CHECK(v[2] == 0x5555555555555555ull, "a neighbouring word changed");
	t_barrier(p);
	target_close(&t);
}

/* ---- Remote access through an MR registered with an iova ---- */

#define IOVA 0x7000000000ull

static void iova_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 8192, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	REQUIRE(in.remote.addr == IOVA, "the target should advertise the iova");
	t_pattern_fill(in.buf, 1000, 61);
	int ret = t_post_send(in.r.qp, 1, IBV_WR_RDMA_WRITE, in.buf, 1000, in.mr->lkey,
			      IBV_SEND_SIGNALED, IOVA + 100, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_WRITE to the iova: %d", ret);
	t_expect_wc(in.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE at iova + 100");
	send_verify(p, 100, 1000, 61);
	memset(in.buf + 4096, 0, 1000);
	ret = t_post_send(in.r.qp, 2, IBV_WR_RDMA_READ, in.buf + 4096, 1000, in.mr->lkey,
			  IBV_SEND_SIGNALED, IOVA + 100, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_READ from the iova: %d", ret);
	if (t_expect_wc(in.r.send_cq, NULL, 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, "READ at iova + 100"))
		CHECK(t_pattern_check(in.buf + 4096, 1000, 61) < 0, "READ at the iova returned "
		      "other data");
	send_done(p);
	t_barrier(p);
	initiator_close(&in);
}

static void iova_child(struct t_peer *p, void *arg)
{
	struct target t;
	t_res_open(&t.r, NULL);
	t.len = 4096;
	t.mem = t_alloc(t.len + 2 * GUARD);
	memset(t.mem, CANARY, t.len + 2 * GUARD);
	t.region = t.mem + GUARD;
	t.mr = ibv_reg_mr_iova2(t.r.pd, t.region, t.len, IOVA,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					IBV_ACCESS_REMOTE_READ);
	REQUIRE(t.mr, "ibv_reg_mr_iova2: %s", strerror(errno));
	t.r.mrs[0] = t.mr;
	struct t_conn local, remote;
	t_conn_local(&t.r, t.mr, &local);
	local.addr = IOVA; /* peers address this MR by its iova */
	t_exchange(p, &local, &remote);
	t_connect(&t.r, &remote);
	t_barrier(p);
	target_verify_loop(p, &t);
	t_barrier(p);
	target_close(&t);
}

/* ---- ibv_rereg_mr: a new translation and access, used remotely ---- */

static void rereg_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 8192, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	t_pattern_fill(in.buf, 2000, 62);
	int ret = t_post_send(in.r.qp, 1, IBV_WR_RDMA_WRITE, in.buf, 2000, in.mr->lkey,
			      IBV_SEND_SIGNALED, in.remote.addr + 10, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_WRITE: %d", ret);
	t_expect_wc(in.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
		    "WRITE through the re-registered MR");
	send_done(p);
	t_barrier(p);
	initiator_close(&in);
}

static void rereg_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, 8192, IBV_ACCESS_LOCAL_WRITE);
	unsigned char *b = t_alloc(16384);
	/* Move the MR to b and open it for remote writes. */
	int ret = ibv_rereg_mr(t.mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS,
			       NULL, b, 16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(ret == 0, "ibv_rereg_mr: %d (errno %d)", ret, errno);
	REQUIRE(t.mr->addr == b, "mr->addr not updated by ibv_rereg_mr");
	t_connect_pair(p, &t.r, t.mr, NULL); /* advertises b and the current rkey */
	struct verify_msg m;
	t_recv_msg(p, &m, sizeof(m), T_WAIT_MS);
	CHECK(t_pattern_check(b + 10, 2000, 62) < 0, "the WRITE did not land in the new buffer");
	bool old_untouched = true;
	for (size_t i = 0; i < t.len; i++)
		old_untouched &= t.region[i] == 0;
	CHECK(old_untouched, "the old translation was written after ibv_rereg_mr moved the MR");
	t_barrier(p);
	target_close(&t);
	free(b);
}

/* ---- ibv_rereg_mr keeps the keys the peer already holds (rxe, mlx5) ---- */

static void rereg_keys_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 8192, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	uint32_t lkey = in.mr->lkey;
	/* Our own MR, to a new PD and back: the lkey stays and still works. */
	struct ibv_pd *pd2 = ibv_alloc_pd(in.r.ctx);
	REQUIRE(pd2, "ibv_alloc_pd");
	int ret = ibv_rereg_mr(in.mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
	CHECK(ret == 0 && in.mr->lkey == lkey, "rereg CHANGE_PD: %d, lkey %#x -> %#x", ret,
	      lkey, in.mr->lkey);
	ret = ibv_rereg_mr(in.mr, IBV_REREG_MR_CHANGE_PD, in.r.pd, NULL, 0, 0);
	CHECK(ret == 0 && in.mr->lkey == lkey, "rereg CHANGE_PD back: %d", ret);
	CHECK(ibv_dealloc_pd(pd2) == 0, "ibv_dealloc_pd");

	/* The target added REMOTE_READ: a READ with the rkey it gave before. */
	t_barrier(p);
	t_pattern_fill(in.buf, 3000, 71);
	ret = t_post_send(in.r.qp, 1, IBV_WR_RDMA_WRITE, in.buf, 3000, in.mr->lkey,
			  IBV_SEND_SIGNALED, in.remote.addr + 100, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_WRITE: %d", ret);
	t_expect_wc(in.r.send_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
		    "WRITE with the rkey held from before CHANGE_ACCESS");
	memset(in.buf + 4096, 0, 3000);
	ret = t_post_send(in.r.qp, 2, IBV_WR_RDMA_READ, in.buf + 4096, 3000, in.mr->lkey,
			  IBV_SEND_SIGNALED, in.remote.addr + 100, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_READ: %d", ret);
	t_expect_wc(in.r.send_cq, NULL, 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ,
		    "READ with the rkey held from before CHANGE_ACCESS gave REMOTE_READ");
	CHECK(t_pattern_check(in.buf + 4096, 3000, 71) < 0, "READ returned other data");

	/* The target moved the MR: only the new address comes, not a key. */
	t_barrier(p);
	uint64_t addr = t_recv_u64(p, T_WAIT_MS);
	t_pattern_fill(in.buf, 2000, 72);
	ret = t_post_send(in.r.qp, 3, IBV_WR_RDMA_WRITE, in.buf, 2000, in.mr->lkey,
			  IBV_SEND_SIGNALED, addr + 10, in.remote.rkey);
	REQUIRE(ret == 0, "post RDMA_WRITE: %d", ret);
	t_expect_wc(in.r.send_cq, NULL, 3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
		    "WRITE with the rkey held from before CHANGE_TRANSLATION");
	send_done(p);
	t_barrier(p);
	initiator_close(&in);
}

static void rereg_keys_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	uint32_t lkey = t.mr->lkey, rkey = t.mr->rkey;
	int ret = ibv_rereg_mr(t.mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ);
	REQUIRE(ret == 0, "ibv_rereg_mr(CHANGE_ACCESS): %d (errno %d)", ret, errno);
	CHECK(t.mr->lkey == lkey && t.mr->rkey == rkey,
	      "CHANGE_ACCESS changed the keys: %#x/%#x -> %#x/%#x", lkey, rkey, t.mr->lkey,
	      t.mr->rkey);
	t_barrier(p);
	t_barrier(p); /* the WRITE and the READ are done */
	CHECK(t_pattern_check(t.region + 100, 3000, 71) < 0, "the first WRITE did not land");
	unsigned char *b = t_alloc(8192);
	ret = ibv_rereg_mr(t.mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b, 8192, 0);
	REQUIRE(ret == 0, "ibv_rereg_mr(CHANGE_TRANSLATION): %d (errno %d)", ret, errno);
	CHECK(t.mr->lkey == lkey && t.mr->rkey == rkey,
	      "CHANGE_TRANSLATION changed the keys: %#x/%#x -> %#x/%#x", lkey, rkey,
	      t.mr->lkey, t.mr->rkey);
	t_send_u64(p, (uint64_t)(uintptr_t)b);
	struct verify_msg m;
	t_recv_msg(p, &m, sizeof(m), T_WAIT_MS);
	CHECK(t_pattern_check(b + 10, 2000, 72) < 0, "the WRITE did not land in the new buffer");
	t_barrier(p);
	target_close(&t);
	free(b);
}

/* ---- A chain mixing every opcode: executed and completed in order ---- */

static void mixed_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	initiator_open(&in, 8192, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	t_barrier(p); /* the target's receives are posted */
	t_pattern_fill(in.buf, 100, 90);
	memset(in.buf + 1000, 0, 200);
	uint64_t *old = (uint64_t *)(void *)(in.buf + 2048);
	*old = 0;
	struct ibv_sge s_w = {(uintptr_t)in.buf, 100, in.mr->lkey};
	struct ibv_sge s_r = {(uintptr_t)(in.buf + 1000), 100, in.mr->lkey};
	struct ibv_sge s_a = {(uintptr_t)old, 8, in.mr->lkey};
	struct ibv_sge s_s = {(uintptr_t)in.buf, 10, in.mr->lkey};
	struct ibv_send_wr w[5];
	memset(w, 0, sizeof(w));
	/* 1: WRITE 100 bytes at +0 (unsignaled) */
	w[0] = (struct ibv_send_wr){.wr_id = 1, .sg_list = &s_w, .num_sge = 1,
				    .opcode = IBV_WR_RDMA_WRITE};
	w[0].wr.rdma.remote_addr = in.remote.addr;
	w[0].wr.rdma.rkey = in.remote.rkey;
	/* 2: READ them back: the responder executes in order, so the READ
	 * sees the WRITE before it. */
	w[1] = (struct ibv_send_wr){.wr_id = 2, .sg_list = &s_r, .num_sge = 1,
				    .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
	w[1].wr.rdma.remote_addr = in.remote.addr;
	w[1].wr.rdma.rkey = in.remote.rkey;
	/* 3: FETCH_AND_ADD at +4096 (the target holds 40 there) */
	w[2] = (struct ibv_send_wr){.wr_id = 3, .sg_list = &s_a, .num_sge = 1,
				    .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				    .send_flags = IBV_SEND_SIGNALED};
	w[2].wr.atomic.remote_addr = in.remote.addr + 4096;
	w[2].wr.atomic.rkey = in.remote.rkey;
	w[2].wr.atomic.compare_add = 2;
	/* 4: SEND 10 bytes */
	w[3] = (struct ibv_send_wr){.wr_id = 4, .sg_list = &s_s, .num_sge = 1,
				    .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	/* 5: WRITE_WITH_IMM, no data (num_sge 0, sg_list NULL) */
	w[4] = (struct ibv_send_wr){.wr_id = 5, .num_sge = 0, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				    .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(5)};
	w[4].wr.rdma.remote_addr = in.remote.addr;
	w[4].wr.rdma.rkey = in.remote.rkey;
	for (int i = 0; i < 4; i++)
		w[i].next = &w[i + 1];
	struct ibv_send_wr *bad = NULL;
	REQUIRE(ibv_post_send(in.r.qp, &w[0], &bad) == 0, "post the mixed chain");
	static const int ops[4] = {IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD, IBV_WC_SEND,
				   IBV_WC_RDMA_WRITE};
	for (int i = 0; i < 4; i++) {
		char what[48];
		snprintf(what, sizeof(what), "mixed chain WR %d", i + 2);
		t_expect_wc(in.r.send_cq, NULL, (uint64_t)i + 2, IBV_WC_SUCCESS, ops[i], what);
	}
	CHECK(t_pattern_check(in.buf + 1000, 100, 90) < 0,
	      "the READ did not return the data of the WRITE posted before it");
	CHECK(*old == 40, "FETCH_AND_ADD returned %llu, expected 40", (unsigned long long)*old);
	CHECK(t_cq_drain(in.r.send_cq, NULL, 0, 20) == 0, "a completion for the unsignaled WRITE");
	t_barrier(p);
	t_barrier(p);
	initiator_close(&in);
}

static void mixed_child(struct t_peer *p, void *arg)
{
	struct target t;
	target_open(&t, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	*(uint64_t *)(void *)(t.region + 4096) = 40;
	t_connect_pair(p, &t.r, t.mr, NULL);
	REQUIRE(t_post_recv(t.r.qp, 1, t.region + 6000, 64, t.mr->lkey) == 0, "ibv_post_recv");
	/* A receive with no scatter list at all (num_sge 0, sg_list NULL). */
	struct ibv_recv_wr rw = {.wr_id = 2, .sg_list = NULL, .num_sge = 0}, *rbad = NULL;
	REQUIRE(ibv_post_recv(t.r.qp, &rw, &rbad) == 0, "ibv_post_recv(num_sge 0, sg_list NULL)");
	t_barrier(p);
	t_barrier(p);
	t_expect_wc(t.r.recv_cq, NULL, 1, IBV_WC_SUCCESS, IBV_WC_RECV, "the chain's SEND");
	t_expect_wc(t.r.recv_cq, NULL, 2, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM,
		    "the chain's WRITE_WITH_IMM");
	CHECK(t_pattern_check(t.region, 100, 90) < 0, "the chain's WRITE data is not in place");
	CHECK(*(uint64_t *)(void *)(t.region + 4096) == 42, "the atomic left %llu, expected 42",
	      (unsigned long long)*(uint64_t *)(void *)(t.region + 4096));
	t_barrier(p);
	target_close(&t);
}

/* ---- Many RDMA READs outstanding at once ---- */

#define NREADS 32

static void reads_parent(struct t_peer *p, void *arg)
{
	int depth = (int)(uintptr_t)arg;
	struct t_opts o = t_opts_default();
	struct t_res probe;
	t_res_open(&probe, NULL);
	int maxd = probe.dev_attr.max_qp_init_rd_atom;
	t_res_close(&probe);
	o.max_rd_atomic = (uint8_t)(depth < maxd ? depth : maxd);
	o.max_send_wr = 2 * NREADS;
	struct initiator in;
	initiator_open(&in, NREADS * 4096, &o);
	t_send_u64(p, o.max_rd_atomic); /* the target uses it as max_dest_rd_atomic */
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	uint64_t t0 = t_now_ms();
	for (int i = 0; i < NREADS; i++) {
		/* READ i fetches remote block (NREADS - 1 - i) */
		int ret = t_post_send(in.r.qp, (uint64_t)i, IBV_WR_RDMA_READ, in.buf + 4096 * i, 4096,
				      in.mr->lkey, IBV_SEND_SIGNALED,
				      in.remote.addr + 4096u * (uint64_t)(NREADS - 1 - i), in.remote.rkey);
		REQUIRE(ret == 0, "post READ #%d: %d", i, ret);
	}
	struct ibv_wc wc[NREADS];
	int got = t_poll(in.r.send_cq, wc, NREADS, T_WAIT_MS);
	CHECK(got == NREADS, "%d of %d READs completed (max_rd_atomic %u)", got, NREADS,
	      o.max_rd_atomic);
	/* About 15 ms here: each READ that waits for a free slot must go as
	 * the slot frees, not when a timer finds it (TCP: a Request held
	 * back for WRs that could not run took 200 ms each, 6.5 s). */
	uint64_t took = t_now_ms() - t0;
	CHECK(took < 2000, "%d READs at max_rd_atomic %u took %llu ms", NREADS,
	      o.max_rd_atomic, (unsigned long long)took);
	for (int i = 0; i < got; i++) {
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i &&
			      wc[i].opcode == IBV_WC_RDMA_READ,
		      "READ completion %d: %s wr_id %llu opcode %s", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id, t_wc_opcode_str(wc[i].opcode));
		long bad = t_pattern_check(in.buf + 4096 * i, 4096, 500u + (unsigned)(NREADS - 1 - i));
		CHECK(bad < 0, "READ %d: data differs at %ld", i, bad);
	}
	t_barrier(p);
	initiator_close(&in);
}

static void reads_child(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.max_rd_atomic = (uint8_t)t_recv_u64(p, T_WAIT_MS);
	struct target t;
	t_res_open(&t.r, &o);
	t.len = NREADS * 4096;
	t.mem = t_alloc(t.len + 2 * GUARD);
	memset(t.mem, CANARY, t.len + 2 * GUARD);
	t.region = t.mem + GUARD;
	for (int i = 0; i < NREADS; i++)
		t_pattern_fill(t.region + 4096 * i, 4096, 500u + (unsigned)i);
	t.mr = t_reg(&t.r, t.region, t.len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	t_connect_pair(p, &t.r, t.mr, NULL);
	t_barrier(p);
	target_close(&t);
}

/* ---- Reads of every size and atomics, all in flight at once ----
 * A responder answers the Requests that arrive together together (over
 * TCP: several responses framed into one write, a large one cut where the
 * socket is full, rsp_step): each Read must get its own bytes, each
 * fetch-and-add the value before it, in order. */
#define NMIXED 32
static const uint32_t mixed_sizes[] = {0, 1, 7, 64, 4095, 4109, 65537, 1200000};
#define NMSIZES (sizeof(mixed_sizes) / sizeof(mixed_sizes[0])) /* Read k (WR i - i / 4) is of size k % NMSIZES */
#define MIXED_SLOT (1200 * 1024) /* each Read's own local and remote slot */

static void inflight_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	struct t_res probe;
	(void)arg;
	t_res_open(&probe, NULL);
	o.max_rd_atomic = (uint8_t)probe.dev_attr.max_qp_init_rd_atom;
	t_res_close(&probe);
	o.max_send_wr = 2 * NMIXED;
	o.cq_size = 2 * NMIXED;
	struct initiator in;
	initiator_open(&in, (size_t)NMIXED * MIXED_SLOT + NMIXED * 8, &o);
	uint64_t *olds = (uint64_t *)(in.buf + (size_t)NMIXED * MIXED_SLOT);
	t_send_u64(p, o.max_rd_atomic);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	/* Remote slot i holds pattern 700 + i; the counter is after them. */
	uint64_t counter = in.remote.addr + (uint64_t)NMIXED * MIXED_SLOT;
	for (int i = 0; i < NMIXED; i++) {
		int ret;
		if (i % 4 == 3) {
			ret = t_post_atomic(in.r.qp, (uint64_t)i, IBV_WR_ATOMIC_FETCH_AND_ADD,
					    &olds[i], in.mr->lkey, counter, in.remote.rkey, 1, 0);
		} else {
			uint32_t len = mixed_sizes[(i - i / 4) % NMSIZES];
			ret = t_post_send(in.r.qp, (uint64_t)i, IBV_WR_RDMA_READ,
					  in.buf + (size_t)i * MIXED_SLOT, len, in.mr->lkey,
					  IBV_SEND_SIGNALED,
					  in.remote.addr + (uint64_t)i * MIXED_SLOT, in.remote.rkey);
		}
		REQUIRE(ret == 0, "post WR #%d: %d", i, ret);
	}
	struct ibv_wc wc[NMIXED];
	int got = t_poll(in.r.send_cq, wc, NMIXED, T_WAIT_MS);
	CHECK(got == NMIXED, "%d of %d WRs completed (max_rd_atomic %u)", got, NMIXED,
	      o.max_rd_atomic);
	uint64_t next_old = 0;
	for (int i = 0; i < got; i++) {
		bool atomic = i % 4 == 3;
		if (!CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i &&
				   wc[i].opcode == (atomic ? IBV_WC_FETCH_ADD : IBV_WC_RDMA_READ),
			   "completion %d: %s wr_id %llu opcode %s", i,
			   t_wc_status_str(wc[i].status), (unsigned long long)wc[i].wr_id,
			   t_wc_opcode_str(wc[i].opcode)))
			continue;
		if (atomic) {
			CHECK(olds[i] == next_old, "fetch-and-add %d: old value %llu, not %llu", i,
			      (unsigned long long)olds[i], (unsigned long long)next_old);
			next_old++;
			continue;
		}
		uint32_t len = mixed_sizes[(i - i / 4) % NMSIZES];
		long bad = t_pattern_check(in.buf + (size_t)i * MIXED_SLOT, len, 700u + (unsigned)i);
		CHECK(bad < 0, "READ %d of %u bytes: data differs at %ld", i, len, bad);
		CHECK(in.buf[(size_t)i * MIXED_SLOT + len] == 0,
		      "READ %d of %u bytes wrote past its end", i, len);
	}
	t_barrier(p);
	initiator_close(&in);
}

static void inflight_child(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	(void)arg;
	o.max_rd_atomic = (uint8_t)t_recv_u64(p, T_WAIT_MS);
	struct target t;
	t_res_open(&t.r, &o);
	t.len = (size_t)NMIXED * MIXED_SLOT + 8;
	t.mem = t_alloc(t.len + 2 * GUARD);
	memset(t.mem, CANARY, t.len + 2 * GUARD);
	t.region = t.mem + GUARD;
	for (int i = 0; i < NMIXED; i++)
		t_pattern_fill(t.region + (size_t)i * MIXED_SLOT, MIXED_SLOT, 700u + (unsigned)i);
	memset(t.region + (size_t)NMIXED * MIXED_SLOT, 0, 8);
	t.mr = t_reg(&t.r, t.region, t.len,
		     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	t_connect_pair(p, &t.r, t.mr, NULL);
	t_barrier(p);
	uint64_t v;
	memcpy(&v, t.region + (size_t)NMIXED * MIXED_SLOT, 8);
	CHECK(v == NMIXED / 4, "the counter is %llu after %d fetch-and-adds",
	      (unsigned long long)v, NMIXED / 4);
	target_close(&t);
}

/* ---- More signaled WRs in flight than the CQ has entries ----
 * Nothing in the verbs spec lets a CQ overrun lose a completion silently;
 * urdma never loses one: all 64 WRITE completions arrive, in order, from a
 * CQ created with 4 entries whose size the application sees unchanged. */
#define NSMALLCQ 64
static void small_cq_parent(struct t_peer *p, void *arg)
{
	struct t_opts o = t_opts_default();
	o.cq_size = 4;
	o.max_send_wr = NSMALLCQ;
	struct initiator in;
	initiator_open(&in, 4096, &o);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	struct t_res *r = &in.r;
	int cqe = r->send_cq->cqe;
	for (int i = 0; i < NSMALLCQ; i++)
		REQUIRE(t_post_send(r->qp, (uint64_t)i, IBV_WR_RDMA_WRITE, in.buf + 8 * i, 8,
				    in.mr->lkey, IBV_SEND_SIGNALED,
				    in.remote.addr + 8u * (uint64_t)i, in.remote.rkey) == 0,
			"post WRITE #%d with no poll in between", i);
	struct ibv_wc wc[NSMALLCQ];
	int got = t_poll(r->send_cq, wc, NSMALLCQ, T_WAIT_MS);
	CHECK(got == NSMALLCQ, "%d of %d WRITE completions from a CQ of %d entries", got,
	      NSMALLCQ, cqe);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i &&
			      wc[i].opcode == IBV_WC_RDMA_WRITE,
		      "completion %d: %s wr_id %llu", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id);
	CHECK(t_cq_drain(r->send_cq, NULL, 0, 50) == 0, "extra completions");
	CHECK(r->send_cq->cqe == cqe, "cq->cqe changed from %d to %d", cqe, r->send_cq->cqe);
	t_barrier(p);
	initiator_close(&in);
}

static void small_cq_child(struct t_peer *p, void *arg)
{
	t_passive_target(p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, T_WAIT_MS);
}

/* ---- Both sides READ each other at once ----
 * Read Requests and Read Responses flow both ways at once, more than the
 * transport's buffers hold: a side that waits to send while the other
 * side also waits, neither reading, deadlocks (over TCP, a responder that
 * blocked on a full socket did: RETRY_EXC_ERR). */
#define XREADS 4
#define XREAD_LEN (8u * MiB)

/* Wait for n completions on r's CQ: busy polling, or (events) asleep in
 * ibv_get_cq_event between polls.  Returns how many came. */
static int xread_wait(struct t_res *r, struct ibv_wc *wc, int n, bool events)
{
	uint64_t end = t_now_ms() + T_WAIT_MS;
	int got = 0;

	if (!events)
		return t_poll(r->send_cq, wc, n, T_WAIT_MS);
	/* Away from the library for a while: the Reads that wait for the
	 * first one are the progress thread's to send. */
	t_sleep_ms(1000);
	while (got < n && t_now_ms() < end) {
		int k;

		REQUIRE(ibv_req_notify_cq(r->send_cq, 0) == 0, "ibv_req_notify_cq");
		k = ibv_poll_cq(r->send_cq, n - got, wc + got);
		REQUIRE(k >= 0, "ibv_poll_cq: %d", k);
		got += k;
		if (got < n && !k)
			t_wait_cq_event(r->channel, r->send_cq, (int)(end - t_now_ms()));
	}
	return got;
}

/* events false: busy polling with XREADS Reads in flight; true: at most
 * two Reads in flight, and the application away for a second and then
 * asleep in ibv_get_cq_event: the progress threads send the Reads that
 * wait, and the Read Responses, both sides at once. */
static void xread_side(struct t_peer *p, unsigned mine, unsigned theirs, bool events)
{
	struct t_opts o = t_opts_default();
	struct t_res r;
	size_t half = (size_t)XREADS * XREAD_LEN;
	unsigned char *mem = t_alloc(2 * half);
	struct ibv_mr *mr;
	struct t_conn remote;
	struct ibv_wc wc[XREADS];
	int got;

	o.max_rd_atomic = events ? 2 : XREADS;
	o.max_send_wr = XREADS;
	o.use_channel = events;
	t_res_open(&r, &o);
	/* [what the peer reads: pattern 'mine'][where its data lands] */
	t_pattern_fill(mem, half, mine);
	memset(mem + half, 0, half);
	mr = t_reg(&r, mem, 2 * half, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	t_connect_pair(p, &r, mr, &remote);
	t_barrier(p);
	for (int i = 0; i < XREADS; i++)
		REQUIRE(t_post_send(r.qp, (uint64_t)i, IBV_WR_RDMA_READ,
				    mem + half + (size_t)i * XREAD_LEN, XREAD_LEN, mr->lkey,
				    IBV_SEND_SIGNALED, remote.addr + (uint64_t)i * XREAD_LEN,
				    remote.rkey) == 0,
			"post READ #%d", i);
	got = xread_wait(&r, wc, XREADS, events);
	CHECK(got == XREADS, "%d of %d READs completed", got, XREADS);
	for (int i = 0; i < got; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i,
		      "READ completion %d: %s wr_id %llu", i, t_wc_status_str(wc[i].status),
		      (unsigned long long)wc[i].wr_id);
	long bad = t_pattern_check(mem + half, half, theirs);
	CHECK(bad < 0, "READ data differs at %ld", bad);
	t_barrier(p); /* neither side deregisters what the other still reads */
	t_res_close(&r);
	free(mem);
}

static void xread_parent(struct t_peer *p, void *arg)
{
	xread_side(p, 71, 72, arg != NULL);
}

static void xread_child(struct t_peer *p, void *arg)
{
	xread_side(p, 72, 71, arg != NULL);
}

/* ---- Writes to pages the target has: no page fault each ---- */

/*
 * A NIC's translation of registered memory is ready at registration.  Ours
 * goes through a mapping of the target's memory, and its first touch of
 * each page faulted: Open MPI over UCX took 3 us per message for its first
 * 4,000 messages (one new receive buffer each) and 0.5 us after.  The
 * mapping now comes with the pages that exist (backing.c: window_prefault):
 * 2,046 Writes, one per page of memory the target has written, cost the
 * initiator far fewer than 2,046 faults.
 */
#define FRESH_PAGES 2048

static void fresh_parent(struct t_peer *p, void *arg)
{
	struct initiator in;
	struct rusage ru0, ru1;
	long faults;

	initiator_open(&in, 4096, NULL);
	t_connect_pair(p, &in.r, in.mr, &in.remote);
	REQUIRE(in.remote.len >= (uint64_t)FRESH_PAGES * 4096, "target too small");
	memset(in.buf, 0x5a, 4096);
	/* The Writes that map the windows (the region may cross into a
	 * second one), first and last page: outside the count, as the
	 * populating counts as faults too (each page it maps is one, taken
	 * in the kernel). */
	for (int i = 0; i < FRESH_PAGES; i += FRESH_PAGES - 1) {
		REQUIRE(t_post_send(in.r.qp, (uint64_t)i, IBV_WR_RDMA_WRITE, in.buf, 8,
				    in.mr->lkey, IBV_SEND_SIGNALED,
				    in.remote.addr + (uint64_t)i * 4096, in.remote.rkey) == 0,
			"post RDMA_WRITE %d", i);
		REQUIRE(t_expect_wc(in.r.send_cq, NULL, (uint64_t)i, IBV_WC_SUCCESS,
				    IBV_WC_RDMA_WRITE, "RDMA_WRITE"), "a first Write failed");
	}
	getrusage(RUSAGE_SELF, &ru0);
	for (int i = 1; i < FRESH_PAGES - 1; i++) {
		bool last = i % 32 == 31 || i == FRESH_PAGES - 2;

		REQUIRE(t_post_send(in.r.qp, (uint64_t)i, IBV_WR_RDMA_WRITE, in.buf, 8,
				    in.mr->lkey, last ? IBV_SEND_SIGNALED : 0,
				    in.remote.addr + (uint64_t)i * 4096, in.remote.rkey) == 0,
			"post RDMA_WRITE %d", i);
		if (last && !t_expect_wc(in.r.send_cq, NULL, (uint64_t)i, IBV_WC_SUCCESS,
					 IBV_WC_RDMA_WRITE, "RDMA_WRITE"))
			break;
	}
	getrusage(RUSAGE_SELF, &ru1);
	faults = ru1.ru_minflt - ru0.ru_minflt;
	t_note("%ld page faults for %d Writes to as many pages", faults, FRESH_PAGES - 2);
	/* (ASan's shadow adds a fault per 8 pages written: 256) */
	CHECK(faults < FRESH_PAGES / 4, "%ld page faults for %d Writes, one per page of "
	      "memory the target has", faults, FRESH_PAGES - 2);
	send_done(p);
	t_barrier(p);
	initiator_close(&in);
}

static void fresh_child(struct t_peer *p, void *arg)
{
	struct target t;

	target_open(&t, (size_t)FRESH_PAGES * 4096,
		    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	t_connect_pair(p, &t.r, t.mr, NULL);
	target_verify_loop(p, &t);
	for (int i = 0; i < FRESH_PAGES; i++)
		if (!CHECK(t.region[(size_t)i * 4096] == 0x5a &&
			   t.region[(size_t)i * 4096 + 8] == 0, "page %d not written as sent", i))
			break;
	t_barrier(p);
	target_close(&t);
}

int main(int argc, char **argv)
{
	t_init(argc, argv);
	t_pair("rdma_write_sizes", write_parent, write_child, NULL);
	t_pair("rdma_write_sge_list", write_sge_parent, write_child, NULL);
	t_pair("rdma_write_target_spins", spin_parent, spin_child, NULL);
	t_pair("rdma_write_target_polled_then_spins", look_parent, look_child,
	       (void *)LOOK_POLLED);
	t_pair("rdma_write_target_received_then_spins", look_parent, look_child,
	       (void *)LOOK_RECEIVED);
	t_pair("rdma_write_target_received_paused_then_spins", look_parent, look_child,
	       (void *)LOOK_PAUSED);
	t_pair("rdma_write_target_placed_then_spins", look_parent, look_child,
	       (void *)LOOK_PLACED);
	t_pair("rdma_write_target_polls_never_sends", hold_parent, hold_child, NULL);
	t_pair("rdma_write_target_polls_often_never_sends", hold_parent, hold_child,
	       HOLD_OFTEN);
	t_pair("rdma_write_with_imm", wimm_parent, wimm_child, NULL);
	t_pair("rdma_read", read_parent, read_child, NULL);
	t_pair("atomics", atomic_parent, atomic_child, NULL);
	t_pair("iova_mr_remote_access", iova_parent, iova_child, NULL);
	t_pair("rereg_mr_remote_write", rereg_parent, rereg_child, NULL);
	t_pair("rereg_mr_keeps_keys", rereg_keys_parent, rereg_keys_child, NULL);
	t_pair("mixed_opcode_chain", mixed_parent, mixed_child, NULL);
	t_pair("fenced_read_after_unsignaled_writes", fence_parent, fence_child, NULL);
	t_pair("outstanding_reads_depth1", reads_parent, reads_child, (void *)1);
	t_pair("outstanding_reads_depth16", reads_parent, reads_child, (void *)16);
	t_pair("reads_of_every_size_and_atomics_in_flight", inflight_parent, inflight_child,
	       NULL);
	t_pair("more_wrs_in_flight_than_cqes", small_cq_parent, small_cq_child, NULL);
	t_pair("both_sides_read_each_other", xread_parent, xread_child, NULL);
	t_pair("both_sides_read_each_other_progress_thread_sends", xread_parent, xread_child,
	       (void *)1);
	t_pair("writes_to_existing_pages_take_no_faults", fresh_parent, fresh_child, NULL);
	return t_finish();
}
