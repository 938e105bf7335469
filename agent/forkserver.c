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

static void reply(int32_t pid, int32_t err, int32_t step) {
    int32_t out[3] = {pid, err, step};
    const char *p = (const char *)out;
    size_t n = sizeof out;
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

/* One request: parse it, start its task, reply. */
static void serve(char *body, uint32_t len, int fds[3]) {
    uint32_t head[4];
    if (len < sizeof head) {
        reply(0, EINVAL, STEP_REQUEST);
        return;
    }
    memcpy(head, body, sizeof head);
    uint32_t argc = head[0], envc = head[1], mask_len = head[2], nlimits = head[3];
    uint64_t fixed = sizeof head + (uint64_t)mask_len + 24ull * nlimits;
    if (argc == 0 || fixed > len || (uint64_t)argc + envc > len) {
        reply(0, EINVAL, STEP_REQUEST);
        return;
    }
    char **ptrs = malloc(sizeof(char *) * ((size_t)argc + envc + 4));
    if (!ptrs) {
        reply(0, ENOMEM, STEP_REQUEST);
        return;
    }
    struct task t = {.mask = (unsigned char *)body + sizeof head, .mask_len = mask_len, .nlimits = nlimits};
    t.limits = t.mask + mask_len;
    memcpy(t.fds, fds, sizeof t.fds);
    char *p = body + fixed, *end = body + len, *names[2];
    t.argv = ptrs;
    t.envp = ptrs + argc + 1;
    if (strings(&p, end, names, 2) || strings(&p, end, t.argv, argc) || strings(&p, end, t.envp, envc)) {
        free(ptrs);
        reply(0, EINVAL, STEP_REQUEST);
        return;
    }
    t.argv[argc] = NULL;
    t.envp[envc] = NULL;
    t.path = names[0];
    t.cwd = names[1];
    int pid = clone(child, child_stack + STACK_SIZE, CLONE_VM | CLONE_VFORK | CLONE_PARENT | SIGCHLD, &t);
    if (pid < 0)
        reply(0, errno, STEP_CLONE);
    else
        reply(pid, t.err, t.step);
    free(ptrs);
}

int main(void) {
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
    for (;;) {
        uint32_t len;
        int fds[3] = {-1, -1, -1}, nfds = 0;
        union {
            char buf[CMSG_SPACE(sizeof(int) * 3)];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = &len, .iov_len = sizeof len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                             .msg_controllen = sizeof control.buf};
        ssize_t r;
        do
            r = recvmsg(SOCK, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
        while (r < 0 && errno == EINTR);
        if (r <= 0)
            return 0; /* the agent closed its end (or is gone) */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
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
        if (r != sizeof len || len > MAX_BODY || (msg.msg_flags & MSG_CTRUNC))
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
