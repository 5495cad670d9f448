/* SPDX-License-Identifier: MIT */
/*
 * Conformance: registration loses no store (issue 18).  ibv_reg_mr moves
 * private pages into shared memory; while it does, other threads keep
 * storing into the same pages (plain stores and atomics, inside and outside
 * the registered range), a thread read()s into one of them, and two threads
 * register at once.  Every store must be there afterwards, every read()
 * must return its bytes, on heap, mmap'ed, huge-page and stack memory.
 * Also: the application's own signal handlers keep working, a thread that
 * blocks every signal (a sigwait() thread) does not stop registration, and
 * a forked child's stores never reach the parent's registered pages.
 */
#include "harness.h"

#include <alloca.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define NPAGES 16
#define REGION (NPAGES * PAGE)
#define NWRITERS 3
#define ROUNDS 400
#define READ_OFF 1024 /* where the reader's bytes go, in page 5 */
#define READ_LEN 2048

enum kind { HEAP, MMAP, HUGE, STACK };
static const char *const kind_name[] = { "heap", "mmap", "huge", "stack" };

/* One round: fresh memory, writers storing, registrations on it. */
struct race {
	struct ibv_pd *pd;
	enum kind kind;
	_Atomic(char *) region;
	atomic_uint round;   /* odd: stores on */
	atomic_int writers_in;
	atomic_bool quit;
	uint64_t plain[NWRITERS]; /* stores made, this round */
	uint64_t atomics;
	atomic_int reg_fail, read_fail;
	atomic_uint read_done; /* the last round the reader finished */
	int pipefd[2];
};

/* Writer w owns the word at 8*w of every page, and shares the word at
 * 256 (atomics) with the others. */
static void *writer(void *arg)
{
	struct race *r = ((void **)arg)[0];
	int w = (int)(intptr_t)((void **)arg)[1];
	unsigned int seen = 0;

	while (!atomic_load(&r->quit)) {
		unsigned int rd = atomic_load(&r->round);
		char *m;
		uint64_t n = 0, a = 0;

		if (!(rd & 1) || rd == seen) {
			sched_yield();
			continue;
		}
		seen = rd;
		m = atomic_load(&r->region);
		atomic_fetch_add(&r->writers_in, 1);
		while (atomic_load(&r->round) == rd) {
			for (int p = 0; p < NPAGES; p++) {
				volatile uint64_t *mine = (uint64_t *)(m + p * PAGE) + w;

				*mine = *mine + 1;
				__atomic_fetch_add((uint64_t *)(m + p * PAGE + 256), 1,
						   __ATOMIC_RELAXED);
			}
			n++;
			a += NPAGES;
			if (!(n & 63))
				sched_yield(); /* two cores: let the others run */
		}
		r->plain[w] = n;
		__atomic_fetch_add(&r->atomics, a, __ATOMIC_RELAXED);
		atomic_fetch_sub(&r->writers_in, 1);
	}
	return NULL;
}

/* read() into page 5, inside the registered range, as the kernel writes. */
static void *reader(void *arg)
{
	struct race *r = arg;
	unsigned int seen = 0;

	while (!atomic_load(&r->quit)) {
		unsigned int rd = atomic_load(&r->round);
		char *dst;
		size_t got = 0;

		if (!(rd & 1) || rd == seen) {
			sched_yield();
			continue;
		}
		seen = rd;
		dst = atomic_load(&r->region) + 5 * PAGE + READ_OFF;
		while (got < READ_LEN) {
			ssize_t k = read(r->pipefd[0], dst + got, READ_LEN - got);

			if (k <= 0) {
				if (k < 0 && errno == EINTR)
					continue;
				atomic_fetch_add(&r->read_fail, 1);
				break;
			}
			got += (size_t)k;
		}
		for (size_t i = 0; i < got; i++)
			if (dst[i] != (char)(rd + i)) {
				atomic_fetch_add(&r->read_fail, 1);
				break;
			}
		atomic_store(&r->read_done, rd);
	}
	return NULL;
}

/* The second registering thread: pages 9-12, while main does 2-7. */
struct reg2 {
	struct race *r;
	char *m;
	pthread_t th;
};

static void *register2(void *arg)
{
	struct reg2 *g = arg;
	struct ibv_mr *mr = ibv_reg_mr(g->r->pd, g->m + 9 * PAGE + 100,
				       3 * PAGE, IBV_ACCESS_LOCAL_WRITE |
						       IBV_ACCESS_REMOTE_WRITE);

	if (!mr)
		atomic_fetch_add(&g->r->reg_fail, 1);
	else
		ibv_dereg_mr(mr);
	return NULL;
}

static char *region_new(enum kind k, void **to_free)
{
	char *m;

	*to_free = NULL;
	switch (k) {
	case HEAP:
		m = malloc(REGION + PAGE);
		*to_free = m;
		return m ? (char *)(((uintptr_t)m + PAGE - 1) & ~(uintptr_t)(PAGE - 1)) : NULL;
	case HUGE:
		m = mmap(NULL, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		*to_free = m;
		m = (char *)(((uintptr_t)m + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1));
		madvise(m, 2 << 20, MADV_HUGEPAGE);
		memset(m, 0, 2 << 20); /* a huge page, where the system gives one */
		return m;
	default:
		m = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (m == MAP_FAILED)
			return NULL;
		*to_free = m;
		return m;
	}
}

static void region_free(enum kind k, void *to_free)
{
	if (k == HEAP)
		free(to_free);
	else if (k == HUGE)
		munmap(to_free, 4 << 20);
	else if (to_free)
		munmap(to_free, REGION);
}

/* One round on memory m: stores on, register twice at once, stores off,
 * then count. */
static bool race_round(struct race *r, char *m, unsigned int rd)
{
	char feed[READ_LEN];
	struct reg2 g = { .r = r, .m = m };
	struct ibv_mr *mr;
	uint64_t want_atomic = 0;
	bool ok = true;

	memset(m, 0, REGION);
	r->atomics = 0;
	atomic_store(&r->region, m);
	atomic_store(&r->round, rd); /* odd: go */
	while (atomic_load(&r->writers_in) < NWRITERS)
		sched_yield();
	for (int i = 0; i < READ_LEN; i++)
		feed[i] = (char)(rd + i);
	/* Half now, half after the registration began: the read() is in the
	 * kernel, waiting, while the pages move. */
	CHECK(write(r->pipefd[1], feed, READ_LEN / 2) == READ_LEN / 2, "pipe");
	pthread_create(&g.th, NULL, register2, &g);
	mr = ibv_reg_mr(r->pd, m + 2 * PAGE + 8, 5 * PAGE + 16,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(write(r->pipefd[1], feed + READ_LEN / 2, READ_LEN / 2) == READ_LEN / 2,
	      "pipe");
	if (!mr) {
		atomic_fetch_add(&r->reg_fail, 1);
		CHECK(false, "ibv_reg_mr on %s memory: %s", kind_name[r->kind],
		      strerror(errno));
	}
	pthread_join(g.th, NULL);
	while (atomic_load(&r->read_done) != rd)
		sched_yield();
	if (mr)
		ibv_dereg_mr(mr);
	atomic_store(&r->round, rd + 1); /* even: stop */
	while (atomic_load(&r->writers_in) > 0)
		sched_yield();
	for (int p = 0; p < NPAGES; p++) {
		for (int w = 0; w < NWRITERS; w++) {
			uint64_t v = ((uint64_t *)(m + p * PAGE))[w];

			if (v != r->plain[w]) {
				CHECK(false, "round %u, %s page %d: writer %d made %llu stores, "
				      "%llu are there", rd / 2, kind_name[r->kind], p, w,
				      (unsigned long long)r->plain[w], (unsigned long long)v);
				ok = false;
			}
		}
		want_atomic += *(uint64_t *)(m + p * PAGE + 256);
	}
	if (want_atomic != r->atomics) {
		CHECK(false, "round %u, %s: %llu atomic increments, %llu are there", rd / 2,
		      kind_name[r->kind], (unsigned long long)r->atomics,
		      (unsigned long long)want_atomic);
		ok = false;
	}
	return ok;
}

/* fn(arg) in a thread of its own on a fresh 1 MiB stack (glibc would hand
 * out a cached one, registered already: no pages to move), joined. */
static void run_on_fresh_stack(void *(*fn)(void *), void *arg)
{
	void *stack = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	pthread_attr_t at;
	pthread_t th;

	REQUIRE(stack != MAP_FAILED, "no memory");
	pthread_attr_init(&at);
	pthread_attr_setstack(&at, stack, 1 << 20);
	REQUIRE(pthread_create(&th, &at, fn, arg) == 0, "thread");
	pthread_join(th, NULL);
	pthread_attr_destroy(&at);
	munmap(stack, 1 << 20);
}

struct stack_round {
	struct race *r;
	unsigned int rd;
	bool ok;
};

/* Stack memory: the region is a local array of a thread of its own. */
static void *stack_donor(void *arg)
{
	struct stack_round *s = arg;
	char buf[REGION + PAGE];
	char *m = (char *)(((uintptr_t)buf + PAGE - 1) & ~(uintptr_t)(PAGE - 1));

	s->ok = race_round(s->r, m, s->rd);
	return NULL;
}

static void race_case(void *arg)
{
	struct race r = { .kind = (enum kind)(intptr_t)arg };
	struct ibv_context *ctx = t_open_first_device();
	pthread_t wt[NWRITERS], rt;
	void *wa[NWRITERS][2];
	void *heap_keep[ROUNDS] = { 0 };
	int bad_rounds = 0;

	REQUIRE(ctx, "no device");
	r.pd = ibv_alloc_pd(ctx);
	REQUIRE(r.pd, "ibv_alloc_pd");
	REQUIRE(pipe(r.pipefd) == 0, "pipe");
	for (int w = 0; w < NWRITERS; w++) {
		wa[w][0] = &r;
		wa[w][1] = (void *)(intptr_t)w;
		pthread_create(&wt[w], NULL, writer, wa[w]);
	}
	pthread_create(&rt, NULL, reader, &r);
	for (unsigned int i = 0; i < ROUNDS && bad_rounds < 3; i++) {
		unsigned int rd = 2 * i + 1;
		bool ok;

		if (r.kind == STACK) {
			/* A fresh stack each round: pages to move. */
			struct stack_round s = { .r = &r, .rd = rd };

			run_on_fresh_stack(stack_donor, &s);
			ok = s.ok;
		} else {
			void *to_free;
			char *m = region_new(r.kind, &to_free);

			REQUIRE(m, "no memory");
			ok = race_round(&r, m, rd);
			/* Heap blocks stay allocated to the end: the next round's
			 * come from pages not registered yet. */
			if (r.kind == HEAP)
				heap_keep[i] = to_free;
			else
				region_free(r.kind, to_free);
		}
		bad_rounds += !ok;
	}
	atomic_store(&r.quit, true);
	for (unsigned int i = 0; i < ROUNDS; i++)
		free(heap_keep[i]);
	close(r.pipefd[1]);
	for (int w = 0; w < NWRITERS; w++)
		pthread_join(wt[w], NULL);
	pthread_join(rt, NULL);
	close(r.pipefd[0]);
	CHECK(atomic_load(&r.reg_fail) == 0, "%d registrations failed",
	      atomic_load(&r.reg_fail));
	CHECK(atomic_load(&r.read_fail) == 0, "%d read()s into the pages failed or lost bytes",
	      atomic_load(&r.read_fail));
	ibv_dealloc_pd(r.pd);
	ibv_close_device(ctx);
}

/* ------------------------------------------------------------------ */

static atomic_int usr1, rtmax;

static void on_usr1(int sig)
{
	(void)sig;
	atomic_fetch_add(&usr1, 1);
}

static void on_rtmax(int sig)
{
	(void)sig;
	atomic_fetch_add(&rtmax, 1);
}

static void *sleeper(void *arg)
{
	sigset_t all;
	int sig;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	sigemptyset(&all);
	sigaddset(&all, SIGUSR2);
	sigwait(&all, &sig);
	return NULL;
}

/* The application's handlers, on SIGUSR1 and on the highest real-time
 * signal, still run; a thread that blocks every signal and waits in
 * sigwait() does not stop registration. */
static void signals_case(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct sigaction sa = { .sa_handler = on_usr1 };
	struct ibv_pd *pd;
	pthread_t th;
	char *m;

	(void)arg;
	REQUIRE(ctx, "no device");
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_rtmax;
	sigaction(SIGRTMAX, &sa, NULL);
	pthread_create(&th, NULL, sleeper, NULL);
	pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	for (int i = 0; i < 20; i++) {
		struct ibv_mr *mr;

		m = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		memset(m, i, 4 * PAGE);
		mr = ibv_reg_mr(pd, m, 4 * PAGE, IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr, "ibv_reg_mr with a sigwait() thread: %s", strerror(errno));
		CHECK(m[0] == (char)i && m[4 * PAGE - 1] == (char)i, "contents changed");
		if (mr)
			ibv_dereg_mr(mr);
		munmap(m, 4 * PAGE);
	}
	raise(SIGUSR1);
	raise(SIGRTMAX);
	CHECK(atomic_load(&usr1) == 1, "SIGUSR1 handler ran %d times", atomic_load(&usr1));
	CHECK(atomic_load(&rtmax) == 1, "SIGRTMAX handler ran %d times", atomic_load(&rtmax));
	pthread_kill(th, SIGUSR2);
	pthread_join(th, NULL);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

/* Whole pages around freed heap blocks: not what a sanitizer's
 * interceptors let memcpy/memset touch. */
__attribute__((no_sanitize("address"))) static void raw_copy(volatile char *d,
							   const volatile char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		d[i] = s[i];
}

__attribute__((no_sanitize("address"))) static void raw_fill(volatile char *d, char c,
							   size_t n)
{
	for (size_t i = 0; i < n; i++)
		d[i] = c;
}

__attribute__((no_sanitize("address"))) static bool raw_equal(const volatile char *a,
							    const volatile char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return false;
	return true;
}

/* The registered pages, for a fork handler of the application's. */
static char *volatile fork_lo;
static size_t fork_len;

/* Set up before the library's first use: it runs in the child before
 * anything the library would register later. */
static void scribble_in_child(void)
{
	if (fork_lo)
		raw_fill(fork_lo, 0x66, fork_len);
}

/* A forked child's stores stay out of the parent's registered pages:
 * from the application's fork handlers on (the library's handler runs
 * first), malloc's included (registered heap pages it hands out next). */
static void fork_case(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	char *p, *lo, *hi, *snap;
	size_t len;
	int status = -1;
	pid_t pid;

	(void)arg;
	REQUIRE(ctx, "no device");
	pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	/* Freed into malloc's top: the next blocks, in the child too, come
	 * from these pages. */
	p = malloc(96 * 1024);
	REQUIRE(p, "malloc");
	lo = (char *)((uintptr_t)p & ~(uintptr_t)(PAGE - 1));
	hi = (char *)(((uintptr_t)p + 96 * 1024) & ~(uintptr_t)(PAGE - 1));
	len = (size_t)(hi - lo);
	free(p);
	mr = ibv_reg_mr(pd, lo, len, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
	fork_lo = hi - PAGE; /* free memory, no malloc header */
	fork_len = PAGE;
	snap = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	raw_copy(snap, lo, len);
	pid = fork();
	if (pid == 0) {
		for (int i = 0; i < 100; i++)
			memset(malloc(200), 0x5a, 200);
		raw_fill(lo, 0x77, len);
		_exit(0);
	}
	REQUIRE(pid > 0, "fork");
	waitpid(pid, &status, 0);
	fork_lo = NULL;
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
	CHECK(raw_equal(snap, lo, len), "the child's stores reached the parent's pages");
	p = malloc(1000);
	CHECK(p, "malloc after fork");
	free(p);
	munmap(snap, len);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

/* A forked child that opens the device while the parent has a CQ: the
 * parent's objects are not the child's (their shared blocks are gone from
 * it), and the child's progress thread must not walk them (it crashed
 * on the parent's CQ block).  The child lives past a progress pass. */
static void fork_open_case(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	int status = -1;
	pid_t pid;

	(void)arg;
#ifdef __SANITIZE_ADDRESS__
	/* Its allocator's locks are not taken around fork: a child whose
	 * parent had a thread inside it hangs in its first free (5 of 10
	 * runs over TCP, the child's progress thread). */
	ibv_close_device(ctx);
	t_skip("AddressSanitizer's allocator does not survive fork in a "
	       "threaded process");
#endif
	REQUIRE(ctx, "no device");
	ch = ibv_create_comp_channel(ctx);
	cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	REQUIRE(cq && !ibv_req_notify_cq(cq, 0), "CQ");
	pid = fork();
	if (pid == 0) {
		struct ibv_context *c2;
		struct ibv_cq *cq2;

		/* a child that hangs dies, and does not outlive the case */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		alarm(20);
		c2 = t_open_first_device();
		if (!c2)
			_exit(2);
		usleep(400 * 1000); /* two of the progress thread's passes */
		cq2 = ibv_create_cq(c2, 16, NULL, NULL, 0);
		if (!cq2 || ibv_req_notify_cq(cq2, 0))
			_exit(3);
		usleep(400 * 1000);
		if (ibv_destroy_cq(cq2) || ibv_close_device(c2))
			_exit(4);
		_exit(0);
	}
	REQUIRE(pid > 0, "fork");
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "child status %#x (a signal: %d)", status,
	      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	CHECK(!ibv_destroy_cq(cq) && !ibv_destroy_comp_channel(ch),
	      "the parent's CQ after the fork");
	ibv_close_device(ctx);
}

/* ---- A buffer on the registering thread's own stack ----
 * rdma_reg_msgs(id, buf) with buf a local array is common.  The page
 * moved holds buf and, below it, the frames of the registration itself
 * (ibv_reg_mr down to the copy and the mapping): a store there between
 * the page's copy and its mapping, a return address among them, would be
 * lost.  sync_endpoints' server crashed so (a return to address 0) once
 * 7b3d536 changed those frames.  Each round a fresh thread, on a fresh
 * stack, registers a buffer placed 64 bytes lower than the round before,
 * so that the page's start falls at every depth of those frames. */
struct own_stack {
	struct ibv_pd *pd;
	size_t pad;
	int bad;
};

static __attribute__((noinline)) int reg_own_buf(struct ibv_pd *pd)
{
	char buf[64];
	struct ibv_mr *mr;
	int bad;

	memset(buf, 0x5a, sizeof(buf));
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		return 2;
	bad = buf[0] != 0x5a || buf[63] != 0x5a;
	return ibv_dereg_mr(mr) ? 3 : bad;
}

static void *own_stack_main(void *arg)
{
	struct own_stack *o = arg;
	volatile char *pad = alloca(o->pad + 1);

	pad[0] = 1;
	o->bad = reg_own_buf(o->pd);
	return NULL;
}

static void own_stack_case(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);

	(void)arg;
	REQUIRE(pd, "ibv_alloc_pd");
	for (size_t pad = 0; pad < 2 * PAGE; pad += 64) {
		struct own_stack o = { .pd = pd, .pad = pad, .bad = -1 };

		run_on_fresh_stack(own_stack_main, &o);
		if (!CHECK(o.bad == 0, "buffer %zu bytes lower: %s", pad,
			   o.bad == 1 ? "its bytes changed" : "the registration failed"))
			break;
	}
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* ---- An application's mmap hook ----
 * UCX's ucm patches mmap and munmap to learn of unmaps, and runs its
 * handlers under its own lock.  A thread stopped by a registration inside
 * such a handler holds that lock; if the registration's own mmap (moving
 * the pages, with the threads stopped) went through the hook it would wait
 * for that lock for ever: ucx_perftest's server hung so in CI.  This
 * binary's mmap and mremap are such hooks while hook_on is set; a thread
 * holds their lock most of the time (as a busy handler would), and the
 * main thread registers fresh memory, 200 times.  The library before
 * hung (the watchdog's 30 s). */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool hook_on, hook_quit;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	bool on = atomic_load(&hook_on);
	void *m;

	if (on)
		pthread_mutex_lock(&hook_lock);
	m = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	if (on)
		pthread_mutex_unlock(&hook_lock);
	return m;
}

void *mremap(void *old, size_t old_len, size_t len, int flags, ...)
{
	bool on = atomic_load(&hook_on);
	void *to = NULL, *m;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		to = va_arg(ap, void *);
		va_end(ap);
	}
	if (on)
		pthread_mutex_lock(&hook_lock);
	m = (void *)syscall(SYS_mremap, old, old_len, len, flags, to);
	if (on)
		pthread_mutex_unlock(&hook_lock);
	return m;
}

static void *hook_holder(void *arg)
{
	(void)arg;
	while (!atomic_load(&hook_quit)) {
		uint64_t t0 = t_now_us();

		pthread_mutex_lock(&hook_lock);
		while (t_now_us() - t0 < 200)
			; /* a handler at work */
		pthread_mutex_unlock(&hook_lock);
		sched_yield();
	}
	return NULL;
}

static void mmap_hook_case(void *arg)
{
	struct ibv_context *ctx = t_open_first_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	pthread_t t;

	(void)arg;
	REQUIRE(pd, "ibv_alloc_pd");
	atomic_store(&hook_on, true);
	REQUIRE(pthread_create(&t, NULL, hook_holder, NULL) == 0, "thread");
	for (int i = 0; i < 200; i++) {
		/* (not through the hook: it waits for the lock) */
		char *p = (char *)syscall(SYS_mmap, NULL, 2 * PAGE, PROT_READ | PROT_WRITE,
					  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct ibv_mr *mr;

		REQUIRE(p != MAP_FAILED, "mmap");
		memset(p, i, 2 * PAGE);
		mr = ibv_reg_mr(pd, p, 2 * PAGE, IBV_ACCESS_LOCAL_WRITE);
		REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
		CHECK(p[0] == (char)i && p[2 * PAGE - 1] == (char)i, "the pages' bytes");
		ibv_dereg_mr(mr);
		munmap(p, 2 * PAGE);
	}
	atomic_store(&hook_quit, true);
	pthread_join(t, NULL);
	atomic_store(&hook_on, false);
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

int main(int argc, char **argv)
{
	pthread_atfork(NULL, NULL, scribble_in_child);
	t_init(argc, argv);
	t_set_case_timeout(100);
	t_case("reg_keeps_stores_heap", race_case, (void *)(intptr_t)HEAP);
	t_case("reg_keeps_stores_mmap", race_case, (void *)(intptr_t)MMAP);
	t_case("reg_keeps_stores_huge", race_case, (void *)(intptr_t)HUGE);
	t_case("reg_keeps_stores_stack", race_case, (void *)(intptr_t)STACK);
	t_case("reg_keeps_signal_handlers", signals_case, NULL);
	t_case("fork_child_stores_stay_its_own", fork_case, NULL);
	t_case("fork_child_opens_device", fork_open_case, NULL);
	t_case("reg_own_stack_buffer", own_stack_case, NULL);
	t_set_case_timeout(30);
	t_case("reg_with_an_mmap_hook", mmap_hook_case, NULL);
	return t_finish();
}
