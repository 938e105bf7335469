/* The agent's spawn helper (see agent/forkserver.py for why it exists and how it is built).
 *
 * A small process that starts tasks for one spawner thread of the agent. Its task processes are the
 * agent's children, not its own (clone with CLONE_PARENT): the agent waits for them, with their rusage,
 * exactly as for processes it started itself. What a task reports as its peak RSS then starts from this
 * process's few hundred KiB, not from the agent's tens of MiB (Linux carries the high-water RSS of the
 * address space that called exec into the new program's).
 *
 * fd 3 is a unix stream socket to the agent. Each request is a header (uint32 length of the body) that
 * carries the task's stdin, stdout and stderr as SCM_RIGHTS -- or no fds at all: the task then keeps
 * this helper's own 0-2, /dev/null (most tasks: no fds to pass, install, dup and close) -- then the body:
 *     uint32 argc, envc, cpu mask bytes, rlimit count
 *     the cpu mask (sched_setaffinity's bytes; none: keep this helper's affinity)
 *     rlimit count x (uint32 resource, uint32 0, uint64 soft, uint64 hard)
 *     NUL-terminated strings: executable path, working directory, argv..., environment...
 * The reply is three int32: the pid (0 when none was started), an errno, and the step that failed
 * (see the STEP_ constants). A child that failed before exec has exited: the agent reaps it.
 * End of file on the socket ends the helper.
 *
 * Started as "forkserver chain", it serves one core of the agent instead, and its tasks are its own
 * children: it queues the requests it gets and starts each one once the task before it has exited, so
 * that a core runs its next task without waiting for the agent (see agent/chaining.py). Each message is
 * a head of four 32-bit fields (kind, body length, sequence number, signal), with a request's body and
 * fds as above after it:
 *     MSG_REQUEST  queue a task (its number: the sequence number)
 *     MSG_CANCEL   drop the queued task of that number (a WITHDRAWN record), if it has not started
 *     MSG_SIGNAL   signal the process group of that task, if it runs (not reaped yet: its pid is its own)
 * It writes 64-byte records (struct record) back: START (pid, times), FAILED (errno, step), EXIT (wait
 * status, times, rusage) and WITHDRAWN, buffered and flushed when the queue is down to half its depth
 * since the last flush (at most LOW_WATER requests: so the agent's next ones come before the queue runs
 * dry) and when it is empty, when FLUSH_AT are buffered, or when the oldest is HOLD_NS old. A queue
 * refilled a few requests at a time is thus answered twice per refill, not once per task.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#define SOCK 3
#define MAX_BODY (64u << 20) /* far above any ARG_MAX: a request this big is the agent's bug */
#define STACK_SIZE (64 * 1024)

enum { STEP_NONE, STEP_REQUEST, STEP_AFFINITY, STEP_RLIMIT, STEP_STREAMS, STEP_CWD, STEP_PGROUP, STEP_EXEC, STEP_CLONE };

struct task {
    const char *path, *cwd;
    char **argv, **envp;
    const unsigned char *mask;
    uint32_t mask_len, nlimits;
    const unsigned char *limits;
    int fds[3];
    volatile int err, step; /* written by the child (CLONE_VM), read once it has exec'd or exited */
};

static char child_stack[STACK_SIZE] __attribute__((aligned(16)));

static int fail(struct task *t, int step) {
    t->err = errno;
    t->step = step;
    _exit(127);
}

/* Runs in the child, on child_stack, sharing this helper's memory until exec (vfork semantics). */
static int child(void *arg) {
    struct task *t = arg;
    if (t->mask_len && sched_setaffinity(0, t->mask_len, (const cpu_set_t *)t->mask) != 0)
        return fail(t, STEP_AFFINITY);
    for (uint32_t i = 0; i < t->nlimits; i++) {
        uint32_t res;
        uint64_t soft, hard;
        memcpy(&res, t->limits + 24 * i, 4);
        memcpy(&soft, t->limits + 24 * i + 8, 8);
        memcpy(&hard, t->limits + 24 * i + 16, 8);
        struct rlimit rl = {.rlim_cur = (rlim_t)soft, .rlim_max = (rlim_t)hard};
        if (setrlimit((int)res, &rl) != 0)
            return fail(t, STEP_RLIMIT);
    }
    for (int i = 0; i < 3; i++) {
        /* The received fds are above 3 (0-2 and the socket are taken), so no dup2 overwrites another. */
        if (dup2(t->fds[i], i) < 0)
            return fail(t, STEP_STREAMS);
    }
    if (t->cwd[0] && chdir(t->cwd) != 0)
        return fail(t, STEP_CWD);
    /* A process group of its own, in the agent's session (the agents' launchers start them in sessions
     * without a terminal). Not a session of its own: a session leader's exit costs each task ~15 us
     * more CPU, 2 % of a /bin/true. */
    if (setpgid(0, 0) < 0)
        return fail(t, STEP_PGROUP);
    execve(t->path, t->argv, t->envp);
    return fail(t, STEP_EXEC);
}

static int read_full(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Write all of [p, p + n) to the agent; exit if it is gone. */
static void write_all(const char *p, size_t n) {
    while (n) {
        ssize_t w = write(SOCK, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(0); /* the agent is gone */
        p += w;
        n -= (size_t)w;
    }
}

static void reply(int32_t pid, int32_t err, int32_t step) {
    int32_t out[3] = {pid, err, step};
    write_all((const char *)out, sizeof out);
}

/* Split ``n`` NUL-terminated strings off [*p, end) into ``out``; -1 if they do not fit. */
static int strings(char **p, char *end, char **out, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        char *nul = memchr(*p, 0, (size_t)(end - *p));
        if (!nul)
            return -1;
        out[i] = *p;
        *p = nul + 1;
    }
    return 0;
}

/* Parse a request into ``t`` (its pointers into ``body``; ``ptrs``: the argv and envp arrays, for the
 * caller to free). 0, or the errno to answer. */
static int parse(char *body, uint32_t len, struct task *t, char ***ptrs) {
    uint32_t head[4];
    if (len < sizeof head)
        return EINVAL;
    memcpy(head, body, sizeof head);
    uint32_t argc = head[0], envc = head[1], mask_len = head[2], nlimits = head[3];
    uint64_t fixed = sizeof head + (uint64_t)mask_len + 24ull * nlimits;
    if (argc == 0 || fixed > len || (uint64_t)argc + envc > len)
        return EINVAL;
    char **p0 = malloc(sizeof(char *) * ((size_t)argc + envc + 4));
    if (!p0)
        return ENOMEM;
    t->mask = (unsigned char *)body + sizeof head;
    t->mask_len = mask_len;
    t->nlimits = nlimits;
    t->limits = t->mask + mask_len;
    char *p = body + fixed, *end = body + len, *names[2];
    t->argv = p0;
    t->envp = p0 + argc + 1;
    if (strings(&p, end, names, 2) || strings(&p, end, t->argv, argc) || strings(&p, end, t->envp, envc)) {
        free(p0);
        return EINVAL;
    }
    t->argv[argc] = NULL;
    t->envp[envc] = NULL;
    t->path = names[0];
    t->cwd = names[1];
    *ptrs = p0;
    return 0;
}

/* One request: parse it, start its task, reply. */
static void serve(char *body, uint32_t len, int fds[3]) {
    struct task t = {0};
    char **ptrs;
    int err = parse(body, len, &t, &ptrs);
    if (err) {
        reply(0, err, STEP_REQUEST);
        return;
    }
    memcpy(t.fds, fds, sizeof t.fds);
    int pid = clone(child, child_stack + STACK_SIZE, CLONE_VM | CLONE_VFORK | CLONE_PARENT | SIGCHLD, &t);
    if (pid < 0)
        reply(0, errno, STEP_CLONE);
    else
        reply(pid, t.err, t.step);
    free(ptrs);
}

/* One message's head (``head_len`` bytes) and its fds (at most 3 kept in ``fds``; more are closed).
 * The number of fds, or -1 at the end of the socket or a broken stream. */
static int receive(void *head, size_t head_len, int fds[3]) {
    int nfds = 0;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = head, .iov_len = head_len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t r;
    do
        r = recvmsg(SOCK, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (r < 0 && errno == EINTR);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); r > 0 && c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < n; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (nfds < 3)
                    fds[nfds++] = fd;
                else
                    close(fd);
            }
        }
    }
    if (r != (ssize_t)head_len || (msg.msg_flags & MSG_CTRUNC)) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        return -1;
    }
    return nfds;
}

/* -- the chained mode ------------------------------------------------------------------------------ */

enum { MSG_REQUEST = 1, MSG_CANCEL, MSG_SIGNAL };
enum { REC_START = 1, REC_FAILED, REC_EXIT, REC_WITHDRAWN };
#define FLUSH_AT 64
#define LOW_WATER 16 /* queued requests at most, for a flush: the agent's refill arrives before they run out */
#define HOLD_NS 20000000LL /* (below the daemon's RECLAIM_AFTER with the agent's own exit hold) */

struct record {
    uint32_t kind, seq;
    int32_t pid, code, step, pad; /* code: errno (FAILED) or wait status (EXIT) */
    int64_t mono_ns, real_ns, utime_us, stime_us, maxrss_kb;
};

struct queued {
    uint32_t seq, len;
    char *body;
    int fds[3], nfds;
    struct queued *next;
};

static struct queued *first, *last;
static int nqueued; /* requests in the queue */
static int low;     /* flush when the queue is down to this: half its depth since the last flush */
static struct record out[FLUSH_AT];
static int outn;
static int64_t oldest; /* monotonic ns of out[0] */
static struct { int pid, pidfd; uint32_t seq; } cur;

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void flush(void) {
    write_all((const char *)out, (size_t)outn * sizeof out[0]);
    outn = 0;
    low = 0;
}

static struct record *add(uint32_t kind, uint32_t seq) {
    if (outn == FLUSH_AT)
        flush();
    struct record *r = &out[outn];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->seq = seq;
    r->mono_ns = now_ns(CLOCK_MONOTONIC);
    if (outn++ == 0)
        oldest = r->mono_ns;
    return r;
}

static void drop(struct queued *q) {
    for (int i = 0; i < q->nfds; i++)
        close(q->fds[i]);
    free(q->body);
    free(q);
}

/* Start the first queued task: it becomes ``cur``, or a FAILED record says why not. */
static void start_next(void) {
    struct queued *q = first;
    first = q->next;
    nqueued--;
    if (!first)
        last = NULL;
    struct task t = {0};
    char **ptrs = NULL;
    int err = q->nfds == 0 || q->nfds == 3 ? parse(q->body, q->len, &t, &ptrs) : EBADF;
    if (err) {
        add(REC_FAILED, q->seq)->code = err;
        out[outn - 1].step = STEP_REQUEST;
        drop(q);
        return;
    }
    for (int i = 0; i < 3; i++)
        t.fds[i] = q->nfds ? q->fds[i] : i; /* none: this helper's own 0-2, /dev/null */
    int64_t real = now_ns(CLOCK_REALTIME);
    int pid = clone(child, child_stack + STACK_SIZE, CLONE_VM | CLONE_VFORK | SIGCHLD, &t);
    free(ptrs);
    if (pid < 0 || t.err) {
        struct record *r = add(REC_FAILED, q->seq);
        r->code = pid < 0 ? errno : t.err;
        r->step = pid < 0 ? STEP_CLONE : t.step;
        if (pid > 0)
            while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
            }
        drop(q);
        return;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct record *r = add(REC_START, q->seq);
    r->pid = pid;
    r->real_ns = real;
    cur.pid = pid;
    cur.pidfd = pidfd; /* (-1: the agent uses this mode only where pidfds work; then wait4 blocks) */
    cur.seq = q->seq;
    drop(q);
}

static void reap(void) {
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(cur.pid, &status, 0, &ru) < 0 && errno == EINTR) {
    }
    struct record *r = add(REC_EXIT, cur.seq);
    r->pid = cur.pid;
    r->code = status;
    r->real_ns = now_ns(CLOCK_REALTIME);
    r->utime_us = (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec;
    r->stime_us = (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec;
    r->maxrss_kb = ru.ru_maxrss;
    if (cur.pidfd >= 0)
        close(cur.pidfd);
    cur.pid = 0;
    cur.pidfd = -1;
}

/* One message from the agent; -1 at the end of the socket (or a broken stream). */
static int take(void) {
    uint32_t head[4];
    int fds[3];
    int nfds = receive(head, sizeof head, fds);
    if (nfds < 0 || head[1] > MAX_BODY)
        return -1;
    if (head[0] == MSG_REQUEST) {
        struct queued *q = calloc(1, sizeof *q);
        char *body = malloc(head[1] ? head[1] : 1);
        if (!q || !body || read_full(SOCK, body, head[1]) != 0)
            return -1;
        q->seq = head[2];
        q->len = head[1];
        q->body = body;
        q->nfds = nfds;
        memcpy(q->fds, fds, sizeof fds);
        if (last)
            last->next = q;
        else
            first = q;
        last = q;
        if (++nqueued / 2 > low)
            low = nqueued / 2 < LOW_WATER ? nqueued / 2 : LOW_WATER;
        return 0;
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (head[1] != 0)
        return -1;
    if (head[0] == MSG_CANCEL) {
        for (struct queued **p = &first, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
            if ((*p)->seq == head[2]) {
                struct queued *q = *p;
                *p = q->next;
                if (last == q)
                    last = prev;
                nqueued--;
                drop(q);
                add(REC_WITHDRAWN, head[2]);
                flush(); /* an answer the daemon waits for (it asked the order back, or it was cancelled) */
                break;
            }
        }
    } else if (head[0] == MSG_SIGNAL) {
        if (cur.pid && cur.seq == head[2] && killpg(cur.pid, (int)head[3]) != 0)
            kill(cur.pid, (int)head[3]); /* (not its group's leader any more: it called setsid) */
    } else
        return -1;
    return 0;
}

static int chain(void) {
    cur.pidfd = -1;
    for (;;) {
        while (!cur.pid && first)
            start_next();
        if (outn && nqueued <= low)
            flush(); /* few left to run (or none): what the agent is owed goes now, and it sends more */
        int timeout = -1;
        if (outn) {
            int64_t left = oldest + HOLD_NS - now_ns(CLOCK_MONOTONIC);
            timeout = left <= 0 ? 0 : (int)((left + 999999) / 1000000);
        }
        struct pollfd p[2] = {{.fd = SOCK, .events = POLLIN}, {.fd = cur.pidfd, .events = POLLIN}};
        int r = poll(p, cur.pid && cur.pidfd >= 0 ? 2 : 1, timeout);
        if (r < 0 && errno != EINTR)
            return 1;
        if (outn && now_ns(CLOCK_MONOTONIC) >= oldest + HOLD_NS)
            flush(); /* (also while messages keep coming: a poll that returns at once is no time-out) */
        if (cur.pid && (cur.pidfd < 0 || (r > 0 && p[1].revents)))
            reap();
        if (r > 0 && p[0].revents && take() != 0)
            return 0; /* the agent closed its end: what runs now is adopted by it (its subreaper) */
    }
}

int main(int argc, char **argv) {
    /* Tasks start with every signal at its default and none blocked, whatever the agent had. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++)
        signal(s, SIG_DFL); /* (fails harmlessly for SIGKILL, SIGSTOP and the reserved ones) */
#ifdef SYS_close_range
    syscall(SYS_close_range, SOCK + 1, ~0u, 0); /* only 0-2 and the socket: nothing else reaches a task */
#endif
    fcntl(SOCK, F_SETFD, FD_CLOEXEC);
    if (argc > 1 && strcmp(argv[1], "chain") == 0)
        return chain();
    for (;;) {
        uint32_t len;
        int fds[3] = {-1, -1, -1};
        int nfds = receive(&len, sizeof len, fds);
        if (nfds < 0)
            return 0; /* the agent closed its end (or is gone), or broke the stream */
        if (len > MAX_BODY)
            return 1; /* a broken stream: the agent sees the end and stops using this helper */
        char *body = malloc(len ? len : 1);
        if (!body || read_full(SOCK, body, len) != 0)
            return 1;
        if (nfds == 0) {
            int own[3] = {0, 1, 2}; /* /dev/null, as the agent started this helper: dup2 to itself is a no-op */
            serve(body, len, own);
        } else if (nfds != 3)
            reply(0, EBADF, STEP_REQUEST);
        else
            serve(body, len, fds);
        free(body);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    }
}
