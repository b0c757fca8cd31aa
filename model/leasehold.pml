/*
 * leasehold's file protocol (docs/PROTOCOL.md), modelled for SPIN.
 *
 * One LOCK, NC contenders (`leasehold run`: acquire, run a command, renew, fence, release),
 * an operator who may `break --force` once, a user of another uid who may plant an
 * observation file once, a person who may delete the mutex file once, and chaos that may
 * crash one contender and pause one contender (wrapper and command frozen together: SIGSTOP
 * of the job, a paused VM) at any step. Time is discrete ticks; host 1's monotonic clock
 * drifts from real time within DRIFT ticks; all timers are relative and saturate, so runs of
 * any length are covered. Switches that leave an adversary out: -DNO_CRASH, -DNO_PAUSE,
 * -DNO_BREAK, -DNO_RM, -DNO_FORGE. -DWRITER adds a directory writer that removes or empties
 * LOCK once, at any moment, on either host (-DWRITER_COPY: or replaces it by a byte copy of
 * itself, `cp` and `mv` two steps; -DCOPY_AT_ONCE: one step); with chaos's deletion of the
 * mutex file (no -DNO_RM) it deletes both. Host 0 is the NFS server: its contenders lock the mutex on the server's own
 * path (and hold their mark in LOCK's directory too), host 1's through an NFS client.
 * -DONE_HOST puts every contender on host 0 (DRIFT should then be 0). -DNO_P2 leaves P2's
 * assertion out (runs where LOCK and the mutex file are both deleted: tokens start again). See
 * model/README.md for the mapping of every variable to the code, the bounds and what is not
 * modelled.
 *
 * Broken variants (each removes one safety step; SPIN must find a counterexample):
 *   -DBROKEN_NO_MARGIN        renew deadline = start + TTL - grace (no margin)
 *   -DBROKEN_WALL_CLOCK       foreign holders judged by their heartbeat_at wall clock
 *   -DBROKEN_NO_INODE_CHECK   no re-check, after flock, that the locked inode is the mutex file's
 *   -DBROKEN_BREAK_FREES      `break` of a live lease frees it at once instead of revoking it
 *   -DBROKEN_TRUST_OTHER_UID  observation files of another uid are believed
 *   -DBROKEN_NO_MARK          contenders ignore the holder's mark (a LOCK read as free is free)
 *   -DBROKEN_LATE_NOTICE      a holder notices a removed or replaced LOCK only at its next
 *                             renewal, and only by content (a byte copy passes)
 *   -DBROKEN_FLOCK_ONLY       the mutex is a flock(2) lock: on the NFS server's own path it does
 *                             not conflict with the clients' byte-range locks, and vice versa
 *   -DBROKEN_NO_DIR_MARK      the holder's mark only on the mutex file, not in LOCK's directory
 *   -DBROKEN_COUNT_UNSEEN     a renewal counts without re-checking that LOCK still names the
 *                             file it wrote
 *   -DBROKEN_NO_GRACE         (with -DREMOUNT) a contender that finds the epoch record naming
 *                             another attachment of the disk grants at once, without the grace
 *   -DBROKEN_NO_CLAIM         (with -DFLOCK1) the look for another program's lock on LOCK's file
 *                             only tests it: the taker does not keep the flock through its rename
 *   -DBROKEN_NO_SERVE         (with -DFLOCK1) the holder closes the claimed old file at release
 *                             without serving a flock(1) blocked on it
 *   -DBROKEN_NO_LOOK          (with -DFLOCK1) a release not in place renames its full released
 *                             record over LOCK without looking for a flock(1) blocked on the file
 *
 * -DFLOCK1 (use with -DONE_HOST): util-linux flock(1) on LOCK, a program that does not know the
 * protocol, on host 0, run FRUNS times (default 1): (a) open LOCK (whatever inode it names now),
 * (b) flock(2) that inode exclusively, blocking, (c) run its command (a command for P1), (d) let
 * go. Every rename over LOCK is a new inode (RENAMED clears fcur: flock(1)'s inode is LOCK no
 * more). A leasehold holder holds the exclusive flock of its lease file from before its rename
 * for its whole holding; a contender whose look lets it in claims LOCK's current file (try-lock,
 * no wait: if another program holds it, it waits) and keeps that flock through its rename and
 * its holding; before its release becomes visible the holder serves a flock(1) blocked on the
 * claimed old file (lets go, waits until flock(1) has run), and releases in place to a flock(1)
 * blocked on its current file (lets go, sets the released bit once flock(1) holds the lock).
 * A flock(1) that has opened a file counts as blocked on it for the holder's looks (its flock(2)
 * follows its open within microseconds; README: not modelled). With crash or pause (a hung holder
 * is SIGKILLed) a holder dies with flock(1) blocked on its claimed old file, which nobody serves:
 * a known gap (gap-flock1-holder-dies).
 *
 * -DFLOCK1_POLL (with -DFLOCK1): flock(1) on an NFS client of the server whose own path the
 * contenders use: its blocking flock(2) is a poll the server's /proc/locks never shows as
 * blocked, so a holder that looks only for blocked requests does not see it (no serving, no
 * release for it: broken-flock1-polling, the rule before 2026-12-04); its lock, once held,
 * is seen (the server's lock table). -DSEE_OPEN: the holder's looks also count a file another
 * open file description has open for writing (the server holds the file open read-write for
 * its client), which sees it from its open on (real-flock1-polling, PROTOCOL.md §10).
 *
 * -DINPLACE (with -DFLOCK1 -DFLOCK1_POLL): holders on NFS clients (PROTOCOL.md §9, "In
 * place", built 2026-12-04): LOCK's inode never changes. The claim is a try-lock of a
 * byte-range write lock from byte 1 on LOCK's current file, which fails while flock(1) or another
 * contender holds its lock there; the take writes the lease into that very file and keeps the
 * claim as its holding's lock; the release lets go, then marks the record released in place.
 * -DBROKEN_RENAME_RELEASE: the take in place, the release still by a full released record
 * renamed over LOCK (refuted: broken-inplace-rename-release). Without crash and pause (a frozen
 * holder on another host keeps its lock until the server's lease on it expires; the code falls
 * back to a rename there, whose window is stated, not modelled).
 *
 * -DREMOUNT (a local disk: use with -DONE_HOST -DDRIFT=0 -DNO_RM): durability per mount epoch
 * (PROTOCOL.md §8). What reached the disk is kept apart from what the page cache shows: a lease
 * renamed over LOCK while the epoch record names the present attachment is not synced (the
 * disk keeps the older record); one taken otherwise first writes the record for this
 * attachment and is synced with it; releases are never synced (the adversarial choice). A
 * disk process drops the disk once, at any moment nobody is inside the mutex, and brings it
 * back as a new attachment: LOCK shows what reached the disk, the kernel marks and mutex locks
 * of the old superblock are out of sight, the token ceiling (always synced) is kept, and every
 * holder on the old attachment can renew and release nothing any more (EIO: its renewals fail
 * as a transient error, so it fences at its deadline). A contender inside the mutex that finds
 * the record naming another attachment rewrites it and grants nothing for a TTL (the longest:
 * every lease here has the same TTL) on its clock.
 *
 * -DHANDOFF (use with -DONE_HOST -DDRIFT=0; not with -DREMOUNT): the direct hand-off of
 * issue 32, DESIGNED, PROTOTYPED, SET ASIDE (slower: docs/performance.md, "A hand-over"). A
 * releasing holder with a live ticket queued may, instead of its released bit, take the mutex and install the head's
 * prepared lease itself: the head's token (high-water mark), a rename over LOCK, the head's
 * ticket unlinked — a lease the head has not confirmed yet (`unconf`, a state of the record).
 * The head, woken, takes its marks and confirms: one lstat (LOCK is still its prepared file)
 * and, only if its deadline has not passed, a header write that confirms the record; its
 * deadline counts from its last look before it slept (before the install: conservative). Past
 * it, it confirms under the mutex, renewing there, or finds the lease gone and waits again. A
 * contender that judges an unconfirmed lease hung stops its job (none runs: a head starts its
 * command only after confirming) and leaves the head alive, frozen, as the code leaves every
 * hung holder (§7): here it is not killed, so that it may resume — the case confirming is for.
 * With -DFLOCK1 too: the releaser lets go of its own file's flock first, then exchanges the head's
 * prepared file with LOCK (renameat2 RENAME_EXCHANGE: its old file, perhaps flock(1)'s X, now
 * has the head's queue name); the head, once confirmed, opens that name and claims the old file
 * (flock, waiting while flock(1) holds it and runs: its guard renews meanwhile, so time is not
 * let pass, as in the serving), keeps the claim for its holding and serves it at its release.
 *   -DBROKEN_NO_CONFIRM       (with -DHANDOFF) the head runs once handed, without confirming
 *   -DBROKEN_FRESH_DEADLINE   (with -DHANDOFF) the head confirms by lstat but counts its
 *                             deadline from the confirmation, not from its last look
 *   -DBROKEN_HANDOFF_NO_CLAIM (with -DHANDOFF -DFLOCK1) the head does not claim the file the
 *                             hand-off replaced
 *
 * Assertions name their property (a constant false tag, or'ed in), so that pan's
 * "assertion violated" line says which one failed: check.sh matches it.
 */

#ifndef NC
#define NC 3
#endif

#define TTL    6
#define GRACE  1
#ifdef BROKEN_NO_MARGIN
#define MARGIN 0
#else
#define MARGIN 2
#endif
#define DL     (TTL - GRACE - MARGIN)  /* renew window: deadline = renewal start + DL */
#ifndef HB
#define HB     2      /* heartbeat interval: TTL/3 */
#endif
#ifndef DRIFT
#define DRIFT  1      /* host 1's clock = real time + off1, off1 in 0..DRIFT */
#endif
#define WSKEW  4      /* host 1's wall clock is this far ahead of host 0's (read only by BROKEN_WALL_CLOCK) */
#ifndef LBOUND
#define LBOUND (TTL + DRIFT + 2) /* bounded liveness: a dead holder's lock is taken within this */
#endif

#define NOBODY 255

/* property tags: always false, never written (see check.sh) */
bool P1_two_commands, P2_token_order, P3_lock_not_taken, P4_resumed_stale, P5_overtaken;

/* contender i's host: C0 and C2 on host 0, C1 on host 1 (with ONE_HOST all on host 0) */
#ifdef ONE_HOST
#define HOST(i) 0
#else
#define HOST(i) ((i) == 1)
#endif
/* i's kernel-lock kind: 1 = on the NFS server's own path (host 0), 0 = through an NFS client.
   Today every lock of either kind conflicts with every other (klock.rs: flock + OFD byte-range
   lock locally, OFD on NFS); with BROKEN_FLOCK_ONLY the two kinds keep separate lock tables. */
#define KIND(i) (HOST(i) == 0)

/* ---------------------------------------------------------------- time
 * There is no absolute time: every timer is relative and saturates, so the state space is
 * finite without a horizon and the check covers runs of any length. Each tick advances real
 * time by 1, host 0's clock by 1 and host 1's clock by 0, 1 or 2, keeping it within DRIFT of
 * real time (off1). */
byte off1;

/* ---------------------------------------------------------------- LOCK (the lease record) */
mtype = { FREE, HELD, REVOKED, RELEASED };
mtype lk_state = FREE;          /* FREE = missing/empty; RELEASED includes the released bit */
byte  lk_owner = NOBODY;        /* lease id: each contender takes at most once, so its index names its lease */
byte  lk_tok;                   /* fencing token */
bool  opened[NC];               /* i's renewal descriptor still names LOCK (cleared by any rename over LOCK) */
bool  mine[NC];                 /* LOCK is still the file i renamed into place (cleared by any rename) */
#ifdef WRITER_COPY
bool  cpp, cpw, cprn;           /* the writer's `cp LOCK x` is done, `mv x LOCK` not yet; a header
                                   write landed in LOCK since the cp; some rename over LOCK since */
bool  msnap[2], osw[2];         /* per host: whether the copy's seq differs from what the host
                                   recorded (as of the cp); the host recorded a seq written after the cp */
mtype cps;                      /* LOCK's state when cp read it */
#endif
#ifdef BROKEN_WALL_CLOCK
byte  hba;                      /* real ticks since heartbeat_at was written (saturates at TTL) */
#define WOFF(h) ((h) -> WSKEW : 0)
#endif

/* ---------------------------------------------------------------- mutex file */
byte mino;                      /* which inode the mutex file's name leads to (0, or 1 once replaced) */
#ifdef BROKEN_FLOCK_ONLY
byte mlk[4] = NOBODY;           /* mutex holder of each inode, per lock kind: [2 * kind + ino] */
#define MI(i, n) (2 * KIND(i) + (n))
#define MFREE(n) (mlk[n] == NOBODY && mlk[2 + (n)] == NOBODY)
#define MDROP(j) if :: mlk[2] == j -> mlk[2] = NOBODY :: else fi; \
                 if :: mlk[3] == j -> mlk[3] = NOBODY :: else fi
#else
byte mlk[2] = NOBODY;           /* mutex holder of each mutex inode (every kind conflicts) */
#define MI(i, n) (n)
#define MFREE(n) (mlk[n] == NOBODY)
#define MDROP(j) skip
#endif
byte hwm[2];                    /* token high-water mark stored in each inode */
byte myino[NC];                 /* the mutex inode i keeps open */
bool mwait[NC];                 /* i is polling for the mutex */
byte mkino[NC];                 /* i's holder's mark: 1 + the mutex inode it is on, 0 = none */
bool dmk[NC];                   /* i's mark again in LOCK's directory (klock::DirRegion): only a
                                   holder on host 0 (a local file system) takes it; deleting the
                                   mutex file leaves it; only a host-0 contender can test it */
#if NC == 3
#define MARKED(n) (mkino[0] == (n) + 1 || mkino[1] == (n) + 1 || mkino[2] == (n) + 1)
#define DMARKED (dmk[0] || dmk[1] || dmk[2])
#else
#define MARKED(n) (mkino[0] == (n) + 1 || mkino[1] == (n) + 1)
#define DMARKED (dmk[0] || dmk[1])
#endif
/* MutexGuard::holder_marked for contender i on mutex inode n */
#ifdef BROKEN_NO_DIR_MARK
#define SEES_MARK(i, n) MARKED(n)
#else
#define SEES_MARK(i, n) (MARKED(n) || HOST(i) == 0 && DMARKED)
#endif

/* ---------------------------------------------------------------- util-linux flock(1) (-DFLOCK1)
 * Locks are tracked relative to two inodes: LOCK's current one and X, the one flock(1) opened. */
#ifdef FLOCK1
#ifndef ONE_HOST
#error "-DFLOCK1 is modelled on one host: add -DONE_HOST"
#endif
#ifndef FRUNS
#define FRUNS 1
#endif
byte fst;                       /* flock(1): 0 idle, 1 opened X, 2 blocked in flock(2) on X, 3 holds X, runs its command */
byte fn;                        /* runs of flock(1) finished */
bool fcur;                      /* X is still LOCK (cleared by any rename over LOCK) */
bool ofl[NC];                   /* i holds the flock of its own lease file (klock::hold_lock_file) */
bool ccur[NC];                  /* i holds the flock of LOCK's current file by its claim (until its rename) */
bool fxo[NC];                   /* i holds the flock of X as its own lease file */
bool fxc[NC];                   /* i holds the flock of X by its claim (the file its lease replaced) */
#define FR (fst == 3)           /* flock(1)'s command runs */
#define FOPEN (fst == 1 || fst == 2)   /* flock(1) opened X and is (as good as) blocked on it */
/* what a holder's looks see of it: a blocked flock(1) in /proc/locks; a polling one (an NFS
   client's, -DFLOCK1_POLL) not there: it is not blocked, it retries. With -DSEE_OPEN the looks
   also ask whether another open file description has the file open for writing
   (klock::open_for_writing_elsewhere, handover::opened_for_writing; the server holds it open
   read-write for its client): that sees a polling flock(1) from its open on, as a blocked one
   is seen */
#if defined(FLOCK1_POLL) && !defined(SEE_OPEN)
#define FSEEN 0
#else
#define FSEEN FOPEN
#endif
#if NC == 3
#define XLOCKED (fxo[0] || fxo[1] || fxo[2] || fxc[0] || fxc[1] || fxc[2])
#define FRN fcur = 0; ccur[0] = 0; ccur[1] = 0; ccur[2] = 0
#else
#define XLOCKED (fxo[0] || fxo[1] || fxc[0] || fxc[1])
#define FRN fcur = 0; ccur[0] = 0; ccur[1] = 0
#endif
#define FKILL(j) ofl[j] = 0; ccur[j] = 0; fxo[j] = 0; fxc[j] = 0
#ifdef INPLACE
/* another contender holds the byte-range lock of LOCK's current file (its holding, or a claim) */
#if NC == 3
#define OTHER_LOCKS(i) ((i != 0 && (ofl[0] && mine[0] || ccur[0])) || (i != 1 && (ofl[1] && mine[1] || ccur[1])) || (i != 2 && (ofl[2] && mine[2] || ccur[2])))
#define NOT_MINE mine[0] = 0; mine[1] = 0; mine[2] = 0
#else
#define OTHER_LOCKS(i) ((i != 0 && (ofl[0] && mine[0] || ccur[0])) || (i != 1 && (ofl[1] && mine[1] || ccur[1])))
#define NOT_MINE mine[0] = 0; mine[1] = 0
#endif
#endif
#else
#define FR false
#define FRN skip
#define FKILL(j) skip
#endif

/* ---------------------------------------------------------------- the disk (-DREMOUNT) */
#ifdef REMOUNT
#define NOEP 2
byte att;                       /* which attachment of the disk is mounted now (0, then 1) */
byte ep = NOEP;                 /* the epoch record: the attachment it names (NOEP: none) */
byte gr;                        /* ticks left of the grace a contender started (0: none) */
mtype dk_state = FREE;          /* LOCK as it is on the disk */
byte dk_owner = NOBODY, dk_tok;
byte att_of[NC];                /* the attachment i's lease was taken on */
#define OLD(i) (att_of[i] != att)
#else
#define OLD(i) false
#endif

/* ---------------------------------------------------------------- the directory writer */
byte wrote;                     /* 0, or 1 + the host on which the writer changed LOCK */

/* ---------------------------------------------------------------- observations (.NAME.leasehold-seen-<uid>), per host */
byte oown[2] = NOBODY;          /* the lease id this host saw ... */
bool orev[2];                   /* ... with this key: the revoked record's fingerprint, or a heartbeat seq ... */
bool moved[2];                  /* ... which has moved since (a renewal landed in LOCK) ... */
byte oage[2];                   /* ... for this long on the host's clock (saturates at TTL) */
bool frg;                       /* a user of another uid planted an observation file at our name */
byte frg_own;                   /* claiming this lease ... */
bool frg_rev, frgm;             /* ... with this key, seen for a TTL already; frgm: the heartbeat moved since */

/* ---------------------------------------------------------------- queue */
byte qcnt;                      /* highest ticket number handed out */
byte qno[NC];                   /* i's ticket number, 0 = none; live while i is not gone */
#ifdef HANDOFF
#if defined(REMOUNT) || !defined(ONE_HOST)
#error "-DHANDOFF is modelled on one host (a local file system), without -DREMOUNT"
#endif
byte handed[NC];                /* the token of the lease installed for i, not yet confirmed by i */
bool unconf;                    /* LOCK's record is a handed lease its head has not confirmed */
#define UNCONF_RENAMED unconf = 0
#ifdef FLOCK1
bool hx[NC];                    /* the file the hand-off to i replaced (now at i's queue name) is X */
#if NC == 3
#define HXCLR hx[0] = 0; hx[1] = 0; hx[2] = 0
#else
#define HXCLR hx[0] = 0; hx[1] = 0
#endif
#endif
#else
#define UNCONF_RENAMED skip
#endif

/* ---------------------------------------------------------------- processes */
bool gone[NC];                  /* the process is gone (crashed, killed, exited) */
bool crashed[NC];               /* killed at an arbitrary step (crash, or SIGKILL of a hung holder) */
bool paused[NC];                /* frozen: wrapper and command */
bool pz;                        /* somebody is paused now */
bool ready[NC];                 /* has taken its turn in this tick */
bool waiting[NC];               /* still wants the lock */
byte lvc;                       /* real ticks since the last death or exit, resume or break (saturates at LBOUND) */

/* ---------------------------------------------------------------- the guards and the commands */
bool hold[NC];                  /* i has a guard: its timers run */
short dlc[NC];                  /* ticks of i's clock left until its renew deadline; lost at <= 0;
                                   its command is dead by -GRACE (saturates there) */
byte due[NC];                   /* ticks of i's clock until its next renewal is due */
bool fl[NC];                    /* a renewal (or the take) is in flight ... */
byte rel[NC];                   /* ... since this many ticks of i's clock */
bool running[NC];               /* i's command runs (set once its lease is durable) */
byte tok[NC];                   /* the token i's command was started with */
byte last_tok;                  /* token of the last command started */

/* Never two commands running at once. A frozen command runs nothing; the invariant can only
 * break where a command starts or a frozen one resumes, and is asserted exactly there. */
#define R(i) (running[i] && !paused[i])
#if NC == 3
#define ONE_CMD (!(R(0) && R(1)) && !(R(0) && R(2)) && !(R(1) && R(2)) && !(FR && (R(0) || R(1) || R(2))))
#else
#define ONE_CMD (!(R(0) && R(1)) && !(FR && (R(0) || R(1))))
#endif

/* A contender is done with this tick: it took its turn, is gone or frozen, or polls a mutex
 * that a frozen process holds. */
#define RDY(i) (ready[i] || gone[i] || paused[i] || \
                (mwait[i] && mlk[MI(i, myino[i])] < NC && paused[mlk[MI(i, myino[i])]]))
#define WT(i) (waiting[i] && !gone[i] && !paused[i])
#define LT(i) (qno[i] && !gone[i])
#define AH(i, me) (LT(i) && (qno[me] == 0 || qno[i] < qno[me]))
#ifdef BROKEN_NO_LOOK
#define BLOCKED_LOOK 0
#else
#define BLOCKED_LOOK 1
#endif
#if NC == 3
#define ALLRDY (RDY(0) && RDY(1) && RDY(2))
#define WAITERS (WT(0) || WT(1) || WT(2))
#define LIVE_TICKET (LT(0) || LT(1) || LT(2))
#define AHEAD(me) (AH(0, me) || AH(1, me) || AH(2, me))
#define FIRST(i) (LT(i) && !AH(0, i) && !AH(1, i) && !AH(2, i))
#define HEAD (FIRST(0) -> 1 : (FIRST(1) -> 2 : (FIRST(2) -> 3 : 0)))
#else
#define ALLRDY (RDY(0) && RDY(1))
#define WAITERS (WT(0) || WT(1))
#define LIVE_TICKET (LT(0) || LT(1))
#define AHEAD(me) (AH(0, me) || AH(1, me))
#define FIRST(i) (LT(i) && !AH(0, i) && !AH(1, i))
#define HEAD (FIRST(0) -> 1 : (FIRST(1) -> 2 : 0))
#endif

/* Every rename over LOCK: a new inode; descriptors on the old one now write where nobody reads. */
#ifdef WRITER_COPY
#define RENAMED opened[0] = 0; opened[1] = 0; mine[0] = 0; mine[1] = 0; cprn = 1; MORE_RENAMED
#else
#define RENAMED opened[0] = 0; opened[1] = 0; mine[0] = 0; mine[1] = 0; MORE_RENAMED
#endif
#if NC == 3
#define MORE_RENAMED opened[2] = 0; mine[2] = 0; FRN; UNCONF_RENAMED
#else
#define MORE_RENAMED FRN; UNCONF_RENAMED
#endif

/* The process dies: the kernel drops its locks (mutex, ticket, mark); PR_SET_PDEATHSIG takes
   its command with it. */
inline kill(j) {
  crashed[j] = 1; gone[j] = 1; paused[j] = 0; running[j] = 0; waiting[j] = 0; mwait[j] = 0;
  hold[j] = 0; dlc[j] = 0; due[j] = 0; fl[j] = 0; rel[j] = 0; lvc = 0; mkino[j] = 0; dmk[j] = 0;
  FKILL(j);
  if :: mlk[0] == j -> mlk[0] = NOBODY :: else fi;
  if :: mlk[1] == j -> mlk[1] = NOBODY :: else fi;
  MDROP(j)
}

/* observe.rs: how long host h has seen exactly this record (lease id and key) */
inline observe(h, age) {
  if
  :: oown[h] == lk_owner && orev[h] == (lk_state == REVOKED) && !moved[h] -> age = oage[h]
  :: else -> oown[h] = lk_owner; orev[h] = (lk_state == REVOKED); moved[h] = 0; oage[h] = 0; age = 0;
#ifdef WRITER_COPY
     /* recorded now, while a copy is pending: the seq written since the cp (the copy's differs),
        or the seq the cp read (the copy's is the same) */
     if :: cpp && cpw -> osw[h] = 1 :: cpp && !cpw -> msnap[h] = 0 :: else fi;
#endif
     skip
  fi;
#ifdef BROKEN_TRUST_OTHER_UID
  if :: frg && frg_own == lk_owner && frg_rev == (lk_state == REVOKED) && !frgm -> age = TTL :: else fi
#endif
}

/* verdict.rs judge: FREE, HELD, STALE or HUNG */
mtype = { V_FREE, V_HELD, V_STALE, V_HUNG };
inline judge(h, v, age) {
  if
  :: lk_state == FREE || lk_state == RELEASED -> v = V_FREE
  :: else ->
     observe(h, age);
     if
     :: HOST(lk_owner) == h ->                  /* same host: process liveness decides */
        if
        :: gone[lk_owner] -> v = V_STALE
        :: else -> v = (age >= TTL -> V_HUNG : V_HELD)
        fi
     :: else ->                                 /* foreign: own observation for its TTL */
        v = (age >= TTL -> V_STALE : V_HELD);
#ifdef BROKEN_WALL_CLOCK                        /* ... or by its own wall-clock heartbeat_at */
        v = (lk_state == HELD && hba + WOFF(h) >= TTL + WOFF(HOST(lk_owner)) -> V_STALE : v)
#else
        skip
#endif
     fi
  fi
}

/* mutex.rs lock_with: try-lock the inode we keep open, then check the name still leads to it. */
inline lock_mutex() {
  mwait[me] = 1;
  do
  :: atomic { mlk[MI(me, myino[me])] == NOBODY -> mlk[MI(me, myino[me])] = me; mwait[me] = 0 };
#ifdef BROKEN_NO_INODE_CHECK
     break
#else
     if
     :: myino[me] == mino -> break
     :: else -> mlk[MI(me, myino[me])] = NOBODY; myino[me] = mino; mwait[me] = 1
     fi
#endif
  od;
  skip
}

inline unlock_mutex() { mlk[MI(me, myino[me])] = NOBODY }

/* Is LOCK gone from under holder me: removed, emptied, replaced by another inode (even a byte
   copy), revoked or taken? (Holding::check, the renewal's check.) */
#ifdef BROKEN_LATE_NOTICE
#define LOST_LOCK(me) (lk_owner != me || lk_state != HELD)     /* by content only */
#else
#define LOST_LOCK(me) (!mine[me] || lk_owner != me || lk_state != HELD)
#endif

/* the deadline counts from the start of the renewal (or from just before the take's rename) */
inline counted() {
  dlc[me] = DL - rel[me];
  due[me] = (rel[me] < HB -> HB - rel[me] : 0)
}

#ifdef HANDOFF
/* The releaser's install, under the mutex (the direct hand-off): the head's token and its
   prepared lease put in place, or, its ticket gone, the released bit after all. With -DFLOCK1
   the lease goes in by RENAME_EXCHANGE: our old file (X, if flock(1) opened it) takes the
   head's queue name, and the head's prepared file, with its flock on it, becomes LOCK. */
inline hand_off() {
  lock_mutex();
  d_step {
    ok = HEAD;                                  /* 1 + the live ticket first in line, 0: none */
    if
    :: ok > 0 && mine[me] && lk_owner == me && lk_state == HELD ->
       t = (hwm[myino[me]] > lk_tok -> hwm[myino[me]] : lk_tok) + 1;
       hwm[myino[me]] = t;                      /* the head's token (reserved while it waited) */
#ifdef FLOCK1
       hx[ok - 1] = fcur && (FOPEN || FR); ofl[ok - 1] = 1;
#endif
       RENAMED; mine[ok - 1] = 1;               /* its prepared lease put in place */
       lk_state = HELD; lk_owner = ok - 1; lk_tok = t; unconf = 1;
       handed[ok - 1] = t; qno[ok - 1] = 0      /* its ticket unlinked: it is no longer queued */
    :: ok > 0 && !(mine[me] && lk_owner == me && lk_state == HELD) -> skip
    :: ok == 0 ->                               /* its ticket went: the released bit after all */
       if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi
    fi;
    ok = 0; t = 0;
    unlock_mutex()
  }
}
#endif

proctype contender(byte me) provided (!paused[me])
{
  byte h = HOST(me), age, t;
  mtype v;
  byte ok;                                      /* a bool, but for the release: 1 blocked, 2 in place */
#ifdef FLOCK1
  byte sv;                                      /* flock(1)'s runs finished when we let go for it */
#endif

  myino[me] = mino;
  waiting[me] = 1;
  {
    skip;
/* ------------------------------------------------ acquire (builder.rs attempt/take) */
attempt:
#ifdef HANDOFF
    if
    :: handed[me] -> goto confirm
    :: else
    fi;
#endif
    lock_mutex();
#ifdef HANDOFF
    if                                          /* installed while we waited for the mutex */
    :: handed[me] -> d_step { unlock_mutex() }; goto confirm
    :: else
    fi;
#endif
    d_step {                                    /* read LOCK (torn reads are retried) and judge */
      judge(h, v, age);
#ifndef BROKEN_NO_MARK
      /* LOCK missing, empty or released, but a holder's mark on our mutex inode: a holder of
         this lock still runs though its record is gone; wait for it */
      if :: v == V_FREE && SEES_MARK(me, myino[me]) -> v = V_HELD :: else fi;
#endif
#ifdef REMOUNT
      /* epoch.rs settling: a record naming another attachment of the disk in this boot starts
         the grace (the record is rewritten for this attachment); nothing is granted during it */
      if :: ep != NOEP && ep != att -> ep = att; gr = TTL :: else fi;
#ifndef BROKEN_NO_GRACE
      if :: gr > 0 -> v = V_HELD :: else fi;
#endif
#endif
      ok = !AHEAD(me) && v != V_HELD;
      /* age now names the same-host holder to stop, plus one (decided on what was read: a
         directory writer may change LOCK before the next step) */
      age = (ok && (v == V_HUNG || v == V_STALE && HOST(lk_owner) == h && !gone[lk_owner]) -> lk_owner + 1 : 0);
#ifdef HANDOFF
      /* a handed lease never confirmed: its head started no command; it is left alive (not
         killed, as the code leaves a hung holder), free to resume */
      if :: unconf -> age = 0 :: else fi;
#endif
      skip
    };
    if
    :: ok ->
       if
       :: age > 0 ->
          d_step { if :: !gone[age - 1] -> kill(age - 1) :: else fi; age = 0; v = 0; ok = 0 }  /* stop_hung: verified SIGKILL */
       :: else -> v = 0; ok = 0
       fi;
#ifdef FLOCK1
       /* claim_lock_file: another program's lock on LOCK's current file? The test is a try-lock
          of its exclusive flock, kept through the rename and the holding */
       d_step {
         if
         :: FR && fcur -> ok = 1                /* flock(1) holds it: wait for it */
#ifdef INPLACE
         :: !(FR && fcur) && OTHER_LOCKS(me) -> ok = 1   /* a holder's lock is still on it */
#endif
         :: else ->
#ifndef BROKEN_NO_CLAIM
            ccur[me] = 1;
            if :: FOPEN && fcur -> fxc[me] = 1 :: else fi;
#endif
            ok = 0
         fi
       };
       if :: ok -> ok = 0; goto queue :: else fi;
#endif
       t = (hwm[myino[me]] > lk_tok -> hwm[myino[me]] : lk_tok) + 1;
       hwm[myino[me]] = t;                      /* high-water mark, fdatasync'ed */
       d_step {                                 /* the holder's mark (MutexGuard::hold_mark) */
         mkino[me] = myino[me] + 1;             /* ... on the mutex inode ... */
         dmk[me] = (HOST(me) == 0)              /* ... and, on a local file system, in LOCK's directory */
       };
       d_step { fl[me] = 1; rel[me] = 0 };      /* the deadline counts from before the rename */
       d_step {                                 /* rename of the new lease over LOCK */
#ifdef INPLACE
         /* NFS, in place: our lease written into LOCK's own file (the same inode), whose lock
            our claim holds and keeps as the holding's */
         NOT_MINE; mine[me] = 1;
         ofl[me] = 1; fxo[me] = (fcur && FOPEN); ccur[me] = 0; fxc[me] = 0;
#else
         RENAMED; mine[me] = 1;
#ifdef FLOCK1
         ofl[me] = 1;                           /* its flock, taken on the new file before the rename */
#endif
#endif
         lk_state = HELD; lk_owner = me; lk_tok = t;
#ifdef REMOUNT
         /* epoch.rs vouches: unsynced under a record naming this attachment; else the record
            is written for it (synced, before the rename) and this lease synced */
         att_of[me] = att;
         if
         :: ep == att
         :: else -> ep = att; dk_state = HELD; dk_owner = me; dk_tok = t
         fi;
#endif
#ifdef BROKEN_WALL_CLOCK
         hba = 0;
#endif
         counted(); hold[me] = 1; fl[me] = 0; rel[me] = 0;
         /* FIFO: nobody who queued before us is still waiting */
#ifndef NO_P5
         assert(!AHEAD(me) || P5_overtaken)
#else
         skip
#endif
       };
       d_step { qno[me] = 0; waiting[me] = 0; unlock_mutex() }  /* unlink ticket, unlock */
       goto start
    :: else ->
#ifdef FLOCK1
queue:                                          /* (a goto may not jump into a d_step) */
       skip;
#endif
       d_step {
         v = 0; ok = 0;
         if :: qno[me] == 0 -> qcnt++; qno[me] = qcnt :: else fi;   /* join the queue */
#ifdef HANDOFF
         fl[me] = 1; rel[me] = 0;               /* our last look: a handed lease's deadline counts from it */
#endif
         unlock_mutex()
       };
       ready[me] = 1;
endwait:
       ready[me] == 0;
       goto attempt
    fi;

#ifdef HANDOFF
/* ------------------------------------------------ the head, handed a lease (designed, set aside) */
confirm:                                        /* (a goto may not jump into a d_step) */
    skip;
    d_step { mkino[me] = myino[me] + 1; dmk[me] = (HOST(me) == 0) };  /* our marks first */
    d_step {                                    /* lstat: LOCK is still our prepared file */
      hold[me] = 1; counted();                  /* the deadline, from our last look */
#ifdef BROKEN_NO_CONFIRM
      dlc[me] = DL; due[me] = HB; ok = 1
#else
      ok = (mine[me] && lk_owner == me && (lk_state == HELD || lk_state == REVOKED));
#ifdef BROKEN_FRESH_DEADLINE
      if :: ok -> dlc[me] = DL; due[me] = HB :: else fi;
#endif
      skip
#endif
    };
    if
    :: ok && dlc[me] > 0 ->                     /* in time: the header write that confirms it */
       d_step {
         if :: mine[me] -> unconf = 0; moved[0] = 1; moved[1] = 1; frgm = 1 :: else fi;
         fl[me] = 0; rel[me] = 0
       }
    :: else ->                                  /* late (or gone): under the mutex */
       lock_mutex();
       d_step {
         if
         :: mine[me] && lk_owner == me && lk_state == HELD ->
            rel[me] = 0; unconf = 0; moved[0] = 1; moved[1] = 1; frgm = 1; counted(); ok = 1
         :: else -> ok = 0
         fi;
         fl[me] = 0; rel[me] = 0;
         unlock_mutex()
       }
    fi;
    if
    :: ok && dlc[me] > 0 ->
       d_step { t = handed[me]; handed[me] = 0; qno[me] = 0; waiting[me] = 0; ok = 0 };
#if defined(FLOCK1) && !defined(BROKEN_HANDOFF_NO_CLAIM)
       /* open our queue name (the releaser's old file since the exchange) and claim it: an
          exclusive flock, waited for while flock(1) holds it and runs its command (our guard
          renews meanwhile: no tick passes, as in the serving); kept for our holding and served
          at our release. Blocked or merely opened, flock(1) comes after us. */
       atomic {                                 /* flock(2), LOCK_EX: one kernel step */
         !(hx[me] && FR) -> if :: hx[me] && FOPEN -> fxc[me] = 1 :: else fi; hx[me] = 0
       };
#endif
       goto start
    :: else ->                                  /* taken over meanwhile: wait again */
       d_step {
         handed[me] = 0; mkino[me] = 0; dmk[me] = 0; hold[me] = 0; dlc[me] = 0; due[me] = 0; ok = 0
       };
       goto attempt
    fi;
#endif

/* ------------------------------------------------ run the command (supervise/, guard.rs) */
start:
    /* The command's process was forked before the acquisition and held at its gate; the
       rename above named it (LeaseBuilder::child): no second write of LOCK here. (A plain
       step first: a goto may not jump into a d_step.) */
    ok = 0;
    d_step {                                    /* not lost: open the start gate */
      if
      :: dlc[me] > 0 ->
         tok[me] = t;
         running[me] = 1;
         assert(ONE_CMD || P1_two_commands);    /* never two commands running at once */
#ifndef NO_P2
         assert(t > last_tok || P2_token_order); /* tokens strictly increase in start order */
#endif
         last_tok = t
      :: else
      fi;
      t = 0; ok = 0
    };
held:
#ifndef BROKEN_LATE_NOTICE
    /* inotify on LOCK's directory: a change made on this host is looked at (read only) at once */
    if :: wrote == h + 1 && dlc[me] > 0 && LOST_LOCK(me) -> dlc[me] = 0 :: else fi;
#endif
    /* watchdog (lost once dlc <= 0) and fencing: SIGTERM at loss, SIGKILL `grace` later */
    if
    :: running[me] && dlc[me] <= 0 ->
       if
       :: dlc[me] <= -GRACE -> running[me] = 0
       :: else -> if :: running[me] = 0 :: skip fi
       fi
    :: running[me] && dlc[me] > 0 -> if :: running[me] = 0 /* the command exits */ :: skip fi
    :: else
    fi;
    if :: !running[me] -> goto release :: else fi;
    /* renewal, every HB (guard.rs renew_once), without the mutex */
    if
    :: dlc[me] > 0 && due[me] == 0 && OLD(me) ->
       /* the disk dropped off: every call on the old superblock fails (EIO), a transient error */
       d_step { fl[me] = 0; rel[me] = 0; ok = 0 }
    :: dlc[me] > 0 && due[me] == 0 && !OLD(me) ->
       d_step { fl[me] = 1; rel[me] = 0 };      /* start of this renewal */
       d_step { opened[me] = 1; ok = !LOST_LOCK(me) };  /* open, read */
       if
       :: !ok ->                                /* taken, revoked or released: lost, fence now */
          d_step { if :: dlc[me] > 0 -> dlc[me] = 0 :: else fi; fl[me] = 0; rel[me] = 0 }
       :: ok ->
          if
          :: d_step {                           /* pwrite of the header */
               if
               :: opened[me] ->                 /* ... into LOCK: seq + 1 */
                  moved[0] = 1; moved[1] = 1; frgm = 1;
#ifdef WRITER_COPY
                  if :: cpp -> cpw = 1 :: else fi;
#endif
#ifdef BROKEN_WALL_CLOCK
                  hba = 0;
#endif
                  skip
               :: else                          /* ... into a replaced inode nobody reads */
               fi
             };
             d_step {                           /* close; counts only if done before the deadline ... */
#ifdef BROKEN_COUNT_UNSEEN
               if :: dlc[me] > 0 -> counted() :: else fi;
#else
               /* ... and if LOCK's name still leads to the file written (fstatat vs fstat):
                  else the lease is lost, fence now */
               if
               :: dlc[me] > 0 && opened[me] -> counted()
               :: dlc[me] > 0 && !opened[me] -> dlc[me] = 0
               :: else
               fi;
#endif
               fl[me] = 0; rel[me] = 0; ok = 0
             }
          :: d_step { fl[me] = 0; rel[me] = 0; ok = 0 }  /* ENOSPC, EIO, storage gone: retry next turn */
          fi
       fi
    :: else
    fi;
    ready[me] = 1;
endheld:
    ready[me] == 0;
    goto held;

/* ------------------------------------------------ release (guard.rs finish) */
release:
    skip;
    d_step { hold[me] = 0; dlc[me] = 0; due[me] = 0 };   /* stop the guard threads */
#ifdef FLOCK1
    /* handover::serve_old_waiters: flock(1) blocked on the file our lease replaced (claimed, not
       LOCK any more) gets it now, while our lease keeps contenders out; we wait until it ran */
#ifdef BROKEN_NO_SERVE
    d_step { fxc[me] = 0 };                     /* closed at release, nobody served */
#else
    if
    :: d_step { FSEEN && !fcur && fxc[me] -> fxc[me] = 0; sv = fn };
       fn != sv
    :: else
    fi;
#endif
#endif
    d_step { mkino[me] = 0; dmk[me] = 0 };      /* the command is dead: drop the marks, then release */
#ifdef FLOCK1
    /* blocked: flock(1) waits for our flock on LOCK's file (mutex::someone_blocked), looked at
       only when the release is not in place: in place (a waiter hints, or after a clean end any
       other open file description has LOCK's file open: FileHolding::release_here, `in_place`,
       and write_released's `Wrote::Opened`) leaves flock(1) on LOCK's own file whoever else
       waits. The model lets a release go in place at any moment, which covers every rule that
       picks it. */
    if
    :: OLD(me) -> skip
    :: !OLD(me) && FSEEN && fcur && fxo[me] && !LIVE_TICKET ->
blocked:                                         /* handover::release_to_blocked */
       skip;
       d_step { ofl[me] = 0; fxo[me] = 0; sv = fn };    /* let go ... */
       (FR || fn != sv);                                /* ... until flock(1) holds it ... */
       d_step { if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi }
    :: !OLD(me) ->                               /* handover::release_in_place */
inplace:                                         /* (a target of the release under the mutex) */
       skip;
       d_step { ofl[me] = 0; fxo[me] = 0 };      /* let go, then ... */
       d_step { if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi }
#ifdef HANDOFF
    :: !OLD(me) && LIVE_TICKET ->               /* the head's prepared lease installed */
       d_step { ofl[me] = 0; fxo[me] = 0 };     /* our file's flock let go first, then ... */
       hand_off()
#endif
#if !defined(INPLACE) || defined(BROKEN_RENAME_RELEASE)
    :: !OLD(me) && !(BLOCKED_LOOK && FSEEN && fcur && fxo[me]) && !LIVE_TICKET ->
       lock_mutex();
       if
       :: d_step {                              /* ensure_ours; opened elsewhere? in place */
            if :: lk_owner == me && lk_state == HELD -> ok = 2 :: else fi
          }
       :: d_step {                              /* ensure_ours; checked last: blocked? else rename */
            if
            :: BLOCKED_LOOK && FSEEN && fcur && fxo[me] -> ok = 1
            :: else ->
               if
               :: lk_owner == me && (lk_state == HELD || lk_state == REVOKED) ->
                  RENAMED; lk_state = RELEASED
               :: else
               fi
            fi
          }
       :: skip                                  /* full disk: header rewritten in place ... */
          d_step { if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi }
       :: skip                                  /* ... or not even that */
       fi;
       unlock_mutex();
       if
       :: ok == 1 -> ok = 0; goto blocked
       :: ok == 2 -> ok = 0; goto inplace
       :: else
       fi
#endif
    fi;
#else
    if
    :: OLD(me) -> skip                          /* the old superblock: nothing can be written */
    :: !OLD(me) && LIVE_TICKET ->                           /* someone waits: released bit in place */
       d_step { if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi }
#ifdef HANDOFF
    :: !OLD(me) && LIVE_TICKET ->               /* ... or the head's prepared lease installed */
       hand_off()
#endif
    :: !OLD(me) && !LIVE_TICKET ->              /* util-linux flock(1) blocked for the holder's
                                                   flock on LOCK's file (release_to_blocked):
                                                   released bit in place, nobody queued */
       d_step { if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi }
    :: !OLD(me) && !LIVE_TICKET ->
       lock_mutex();
       if
       :: d_step {                              /* ensure_ours; rename a released record */
            if
            :: lk_owner == me && (lk_state == HELD || lk_state == REVOKED) ->
               RENAMED; lk_state = RELEASED
            :: else
            fi
          }
       :: skip                                  /* full disk: header rewritten in place ... */
          d_step { if :: mine[me] && lk_owner == me && lk_state == HELD -> lk_state = RELEASED :: else fi }
       :: skip                                  /* ... or not even that */
       fi;
       unlock_mutex()
    fi;
#endif
    d_step {                                    /* exits; a lost holder may leave its record behind: */
      gone[me] = 1;                             /* P3's clock then counts from now */
      FKILL(me);                                /* its flocks go with it */
      if :: lk_owner == me && (lk_state == HELD || lk_state == REVOKED) -> lvc = 0 :: else fi
    }
  } unless { crashed[me] }
}

/* ------------------------------------------------ time */
inline advance(i, a) {
  if
  :: hold[i] -> dlc[i] = (dlc[i] - a > -GRACE -> dlc[i] - a : -GRACE);
                due[i] = (due[i] > a -> due[i] - a : 0)
  :: else
  fi;
  if :: fl[i] -> rel[i] = (rel[i] + a < TTL -> rel[i] + a : TTL) :: else fi
}

active proctype tick()
{
  byte a1;
end:
  do
  :: atomic {
       ALLRDY ->
       /* bounded liveness: a dead holder's lock is taken by a live waiter within LBOUND */
       assert(!((lk_state == HELD || lk_state == REVOKED) && gone[lk_owner] &&
                WAITERS && !pz && lvc >= LBOUND
#ifdef FLOCK1
                && !(FR && fcur)
#endif
               ) || P3_lock_not_taken);
       ready[0] = 0; ready[1] = 0;
#if NC == 3
       ready[2] = 0;
#endif
       if
       :: off1 > 0 -> off1--; a1 = 0
       :: off1 < DRIFT -> off1++; a1 = 2
       :: a1 = 1
       fi;
       advance(0, 1); advance(1, a1);
#if NC == 3
       advance(2, 1);
#endif
       oage[0] = (oage[0] < TTL -> oage[0] + 1 : TTL);
       oage[1] = (oage[1] + a1 < TTL -> oage[1] + a1 : TTL);
#ifdef BROKEN_WALL_CLOCK
       hba = (hba < TTL -> hba + 1 : TTL);
#endif
       lvc = (lvc < LBOUND -> lvc + 1 : LBOUND);
#ifdef REMOUNT
       gr = (gr > 0 -> gr - 1 : 0);
#endif
       a1 = 0
     }
  od
}

/* ------------------------------------------------ the operator: leasehold break --force (status.rs) */
#ifndef NO_BREAK
active proctype breaker()
{
end:
  atomic {
    MFREE(mino) && lk_state == HELD ->
#ifdef BROKEN_BREAK_FREES
    RENAMED; lk_state = RELEASED; lvc = 0
#else
#ifdef HANDOFF
    /* the revoked record keeps what it says of its holder: unconfirmed, if it was */
    if :: unconf -> RENAMED; unconf = 1 :: else -> RENAMED fi;
    lk_state = REVOKED; lvc = 0
#else
    RENAMED; lk_state = REVOKED; lvc = 0        /* same lease id, holder and token */
#endif
#endif
  }
}
#endif

/* ------------------------------------------------ chaos: one crash, one pause, one mutex replacement, one planted file */
active proctype chaos()
{
  byte j, pj = NOBODY;
  bool crash = 1, pause = 1, rm = 1, forge = 1;
#ifdef NO_PAUSE
  pause = 0;
#endif
#ifdef NO_CRASH
  crash = 0;
#endif
#ifdef NO_RM
  rm = 0;
#endif
#ifdef NO_FORGE
  forge = 0;
#endif
end:
  do
  :: atomic { crash -> select(j : 0 .. NC - 1);
       if :: !gone[j] -> kill(j); crash = 0 :: else fi; j = 0 }
  :: atomic { pause && pj == NOBODY -> select(j : 0 .. NC - 1);
       if :: !gone[j] -> paused[j] = 1; pj = j; pz = 1; pause = 0 :: else fi; j = 0 }
  :: atomic { pj != NOBODY ->                /* resume, any time later */
       paused[pj] = 0; pz = 0; lvc = 0;
       if                                       /* the watchdog fires first on resume */
       :: running[pj] && dlc[pj] <= 0 -> running[pj] = 0
       :: else
       fi;
       /* a resumed holder's command never runs beside a newer one */
       assert(!running[pj] || last_tok == tok[pj] || P4_resumed_stale);
       assert(ONE_CMD || P1_two_commands);
       pj = NOBODY
     }
  :: atomic { rm && MFREE(mino) -> mino = 1; rm = 0 }  /* rm the mutex file; the next open creates it anew */
  :: atomic { forge && (lk_state == HELD || lk_state == REVOKED) ->
       frg = 1; forge = 0; frg_own = lk_owner; frg_rev = (lk_state == REVOKED); frgm = 0 }
  od
}

/* ------------------------------------------------ a directory writer (a person, a cleanup job, a deploy)
 * Once, at any moment, on either host, without any lock: removes LOCK, empties it (same inode),
 * or replaces it with a byte copy of itself (another inode, the bytes `cp` read: `cp LOCK x`,
 * then, any time later, `mv x LOCK`). Only heartbeat writes are modelled between the two: if
 * LOCK was renamed over or its state changed meanwhile (the copy would bring back an older
 * lease), the writer gives up (README: not modelled). */
#ifdef WRITER
active proctype writer()
{
  byte w;
end:
  atomic {
    lk_state != FREE ->
    if :: w = 1 :: w = 2 fi;
    if
    :: wrote = w; RENAMED; lk_state = FREE; lk_owner = NOBODY; lk_tok = 0   /* rm LOCK */
    :: wrote = w; lk_state = FREE; lk_owner = NOBODY; lk_tok = 0            /* truncate LOCK */
#ifdef WRITER_COPY
#ifdef COPY_AT_ONCE
    :: wrote = w; RENAMED                                       /* cp LOCK x; mv x LOCK, at once */
#else
    :: cpp = 1; cpw = 0; cprn = 0; cps = lk_state;                          /* cp LOCK x */
       msnap[0] = moved[0]; msnap[1] = moved[1]; osw[0] = 0; osw[1] = 0
#endif
#endif
    fi
  };
#ifdef WRITER_COPY
end_mv:
  atomic {
    cpp ->                                                      /* mv x LOCK */
    if
    :: !cprn && lk_state == cps ->
       wrote = w; RENAMED;
       /* the copy's seq is the one cp read: moved for a host that recorded a later one */
       if :: cpw -> moved[0] = msnap[0] || osw[0]; moved[1] = msnap[1] || osw[1] :: else fi
    :: else                                                     /* out of scope: give up */
    fi;
    cpp = 0; cpw = 0; cprn = 0; cps = 0;
    msnap[0] = 0; msnap[1] = 0; osw[0] = 0; osw[1] = 0
  }
#endif
}
#endif

#ifdef REMOUNT
active proctype disk()
{
end:
  atomic {
    att == 0 && mlk[0] == NOBODY && mlk[1] == NOBODY ->
    att = 1;
    /* a new superblock: another mutex inode, with the synced ceiling */
    mino = 1; hwm[1] = hwm[0];
    /* LOCK as it reached the disk */
    RENAMED; lk_state = dk_state; lk_owner = dk_owner; lk_tok = dk_tok;
    /* the old holders' marks are on the old superblock's inodes: out of sight */
    dmk[0] = 0; dmk[1] = 0;
#if NC == 3
    dmk[2] = 0;
#endif
    lvc = 0
  }
}
#endif

/* ------------------------------------------------ util-linux flock(1) on LOCK (-DFLOCK1)
 * A program that knows nothing of the protocol: opens LOCK, then (a separate step) flock(2)s the
 * inode it opened, exclusively, blocking; runs its command; lets go. Its lock on a file that is no
 * longer LOCK excludes nobody else. */
#ifdef FLOCK1
active proctype flock1()
{
end:
  do
  :: atomic { fst == 0 && fn < FRUNS ->          /* open LOCK: whatever inode it names now */
       fst = 1; fcur = 1;
#ifdef HANDOFF
       HXCLR;                                   /* X is LOCK's file now, no file a hand-off replaced */
#endif
       fxo[0] = ofl[0] && mine[0]; fxc[0] = ccur[0];
       fxo[1] = ofl[1] && mine[1]; fxc[1] = ccur[1];
#if NC == 3
       fxo[2] = ofl[2] && mine[2]; fxc[2] = ccur[2];
#endif
       skip }
  :: atomic { fst == 1 -> fst = 2 }             /* flock(2), LOCK_EX: blocks while anyone holds it */
  :: atomic { fst == 2 && !XLOCKED ->            /* has it: runs its command */
       fst = 3;
       assert(ONE_CMD || P1_two_commands) }
  :: atomic { fst == 3 ->                       /* the command ends; the lock goes with the close */
       fst = 0; fn++; fcur = 0; lvc = 0;
       fxo[0] = 0; fxc[0] = 0; fxo[1] = 0; fxc[1] = 0;
#if NC == 3
       fxo[2] = 0; fxc[2] = 0;
#endif
       skip }
  od
}
#endif

init {
  atomic {
#ifdef REMOUNT
    /* an earlier run may have left an epoch record for this attachment, the disk showing LOCK
       free (then the first lease here goes unsynced), or none */
    if :: ep = 0 :: ep = NOEP fi;
#endif
    run contender(0); run contender(1);
#if NC == 3
    run contender(2);
#endif
  }
}
