//! Every SQL statement of the store, with the store's PostgreSQL schema name filled in.
//!
//! Statements are prepared once per connection (deadpool-postgres' statement cache) and then
//! executed by name. Times are compared on the server's clock ([`NOW_MS`]), so that the
//! workers' clocks never decide whether a lease is live.

/// The server's wall clock, in ms since the Unix epoch.
pub(crate) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Whether the run of row `r` (running or waiting) needs a driver now, from the columns that
/// keep its [`RunInfo::readiness`](loops_core::RunInfo::readiness): `wait_until_ms` (ready
/// from then on) and `wait_event` (ready once that event is in the inbox, undelivered). Rows
/// written before the columns meant that leave them empty for a running run, hence
/// `status = 'running'`.
const READY: &str = "(r.status = 'running' OR r.wait_until_ms <= {now} \
     OR EXISTS (SELECT 1 FROM {s}.inbox i WHERE i.run_id = r.run_id \
       AND i.name = r.wait_event AND NOT i.delivered))";

/// The statements of one store, for one PostgreSQL schema.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) lock_lease: String,
    pub(crate) commit_batch: String,
    pub(crate) lock_run: String,
    pub(crate) read_run: String,
    pub(crate) lock_runs: String,
    pub(crate) insert_run: String,
    pub(crate) update_run: String,
    pub(crate) insert_journal: String,
    pub(crate) journal_exists: String,
    pub(crate) schema_exists: String,
    pub(crate) insert_schema: String,
    pub(crate) insert_step: String,
    pub(crate) step_exists: String,
    pub(crate) next_failure_index: String,
    pub(crate) insert_failure: String,
    pub(crate) failures_of_seq: String,
    pub(crate) first_pending: String,
    pub(crate) mark_delivered: String,
    pub(crate) event_by_key: String,
    pub(crate) next_event_seq: String,
    pub(crate) insert_event: String,
    pub(crate) delete_runs: String,
    pub(crate) set_attribute: String,
    pub(crate) attributes: String,
    pub(crate) search: String,
    pub(crate) read_info: String,
    pub(crate) latest: String,
    pub(crate) history: String,
    pub(crate) steps: String,
    pub(crate) all_steps: String,
    pub(crate) failures: String,
    pub(crate) events: String,
    pub(crate) has_pending: String,
    pub(crate) list: String,
    pub(crate) children: String,
    pub(crate) live_children: String,
    pub(crate) children_of_runs: String,
    pub(crate) list_workflow: String,
    pub(crate) list_of_schemas: String,
    pub(crate) count_runs: String,
    pub(crate) schema: String,
    pub(crate) schemas: String,
    pub(crate) sealing_keys: String,
    pub(crate) insert_sealing_key: String,
    pub(crate) sealing_checks: String,
    pub(crate) lock_schedule: String,
    pub(crate) insert_schedule: String,
    pub(crate) update_schedule: String,
    pub(crate) delete_schedule: String,
    pub(crate) schedules: String,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) notify: String,
    pub(crate) listen: String,
    pub(crate) renew: String,
    pub(crate) claim_ready: String,
    pub(crate) announce: String,
    pub(crate) limit_declare: String,
    pub(crate) limit_lock: String,
    pub(crate) limit_redeclare: String,
    pub(crate) limit_lease_live: String,
    pub(crate) limit_drop_lapsed: String,
    pub(crate) limit_holding: String,
    pub(crate) limit_drop_starts: String,
    pub(crate) limit_starts: String,
    pub(crate) limit_insert_permit: String,
    pub(crate) limit_insert_start: String,
    pub(crate) limit_release: String,
}

impl Sql {
    /// The statements for the schema `schema` (a validated name: lowercase letters, digits
    /// and `_`).
    // This function is long because it is the list of the store's statements, one field each: split, the
    // statements would be farther from the struct they fill.
    pub(crate) fn new(schema: &str) -> Sql {
        let s = format!("\"{schema}\"");
        let f = |sql: &str| {
            sql.replace("{ready}", READY)
                .replace("{channel}", schema)
                .replace("{s}", &s)
                .replace("{now}", NOW_MS)
        };
        Sql {
            lock_lease: f("SELECT token, expires_ms > {now} FROM {s}.leases \
                 WHERE run_id = $1 FOR UPDATE"),
            lock_run: f("SELECT info FROM {s}.runs WHERE run_id = $1 FOR UPDATE"),
            read_run: f("SELECT info FROM {s}.runs WHERE run_id = $1"),
            // The one-round-trip commit (fast.rs, migration 11): one array per column, one
            // write at each index: $1 run, $2 lease token, $3 the row's text; $4..$6 a record
            // key (seq; step name and occurrence), $7 its record; $8..$13 the new row's
            // columns (as `update_run`'s $2..$7).
            commit_batch: f("SELECT {s}.commit_batch($1, $2, $3, $4, $5, $6, $7, \
                 $8, $9, $10, $11, $12, $13)"),
            lock_runs: f("SELECT info, run_id FROM {s}.runs WHERE run_id = ANY($1) \
                 ORDER BY run_id FOR UPDATE"),
            insert_run: f("INSERT INTO {s}.runs \
                 (run_id, workflow, status, seq, wait_event, wait_until_ms, info, schema, parent) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"),
            update_run: f(
                "UPDATE {s}.runs SET status = $2, seq = $3, wait_event = $4, \
                 wait_until_ms = $5, info = $6, schema = $7 WHERE run_id = $1",
            ),
            insert_journal: f("INSERT INTO {s}.journal (run_id, seq, record) VALUES ($1, $2, $3)"),
            journal_exists: f("SELECT EXISTS (SELECT 1 FROM {s}.journal \
                 WHERE run_id = $1 AND seq = $2)"),
            schema_exists: f("SELECT EXISTS (SELECT 1 FROM {s}.schemas WHERE hash = $1)"),
            insert_schema: f(
                "INSERT INTO {s}.schemas (hash, description) VALUES ($1, $2) \
                 ON CONFLICT (hash) DO NOTHING",
            ),
            insert_step: f(
                "INSERT INTO {s}.steps (run_id, seq, name, occurrence, record) \
                 VALUES ($1, $2, $3, $4, $5)",
            ),
            step_exists: f("SELECT EXISTS (SELECT 1 FROM {s}.steps \
                 WHERE run_id = $1 AND seq = $2 AND name = $3 AND occurrence = $4)"),
            next_failure_index: f("SELECT coalesce(max(idx) + 1, 0) FROM {s}.failures \
                 WHERE run_id = $1 AND seq = $2 AND attempt = $3"),
            insert_failure: f(
                "INSERT INTO {s}.failures (run_id, seq, attempt, idx, record) \
                 VALUES ($1, $2, $3, $4, $5)",
            ),
            // The records of the seq's highest attempt with any, highest index first.
            failures_of_seq: f("SELECT attempt, idx, record FROM {s}.failures \
                 WHERE run_id = $1 AND seq = $2 AND attempt = (SELECT max(attempt) \
                 FROM {s}.failures WHERE run_id = $1 AND seq = $2) ORDER BY idx DESC"),
            first_pending: f("SELECT event_seq, record FROM {s}.inbox \
                 WHERE run_id = $1 AND name = $2 AND NOT delivered \
                 ORDER BY event_seq LIMIT 1"),
            mark_delivered: f("UPDATE {s}.inbox SET delivered = true \
                 WHERE run_id = $1 AND event_seq = $2"),
            event_by_key: f("SELECT event_seq FROM {s}.inbox WHERE run_id = $1 AND key = $2"),
            next_event_seq: f("SELECT coalesce(max(event_seq) + 1, 0) FROM {s}.inbox \
                 WHERE run_id = $1"),
            insert_event: f(
                "INSERT INTO {s}.inbox (run_id, event_seq, name, key, record) \
                 VALUES ($1, $2, $3, $4, $5)",
            ),
            // Every table's rows of the runs `$1` (which the plan chose: ended runs).
            delete_runs: f(
                "WITH runs AS (DELETE FROM {s}.runs WHERE run_id = ANY($1)), \
                 journal AS (DELETE FROM {s}.journal WHERE run_id = ANY($1)), \
                 steps AS (DELETE FROM {s}.steps WHERE run_id = ANY($1)), \
                 failures AS (DELETE FROM {s}.failures WHERE run_id = ANY($1)), \
                 inbox AS (DELETE FROM {s}.inbox WHERE run_id = ANY($1)), \
                 attributes AS (DELETE FROM {s}.attributes WHERE run_id = ANY($1)) \
                 DELETE FROM {s}.leases WHERE run_id = ANY($1)",
            ),
            // A run's attribute $2 gets the value of index bytes $3, replacing the one it had.
            set_attribute: f(
                "INSERT INTO {s}.attributes (run_id, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value",
            ),
            attributes: f("SELECT key, value FROM {s}.attributes WHERE run_id = $1 ORDER BY key"),
            // The candidates of a search: the runs whose attribute $1 lies in [$2, $3) (index
            // bytes; a range of `attributes_search`), narrowed by status ($4, empty: any) and
            // workflow ($5, null: any), each with every attribute it has, by run id.
            search: f("SELECT r.run_id, r.info, a.key, a.value \
                 FROM {s}.attributes c \
                 JOIN {s}.runs r ON r.run_id = c.run_id \
                 JOIN {s}.attributes a ON a.run_id = c.run_id \
                 WHERE c.key = $1 AND c.value >= $2 AND c.value < $3 \
                 AND (cardinality($4::text[]) = 0 OR r.status = ANY($4)) \
                 AND ($5::text IS NULL OR r.workflow = $5) \
                 ORDER BY r.run_id, a.key"),
            read_info: f("SELECT info FROM {s}.runs WHERE run_id = $1"),
            latest: f("SELECT r.info, j.record FROM {s}.runs r \
                 LEFT JOIN {s}.journal j ON j.run_id = r.run_id AND j.seq = r.seq \
                 WHERE r.run_id = $1"),
            history: f("SELECT seq, record FROM {s}.journal WHERE run_id = $1 ORDER BY seq"),
            steps: f("SELECT name, occurrence, record FROM {s}.steps \
                 WHERE run_id = $1 AND seq = $2 ORDER BY name, occurrence"),
            all_steps: f("SELECT seq, name, occurrence, record FROM {s}.steps \
                 WHERE run_id = $1 ORDER BY seq, name, occurrence"),
            failures: f("SELECT seq, record FROM {s}.failures WHERE run_id = $1 \
                 ORDER BY seq, attempt, idx"),
            events: f("SELECT event_seq, record, delivered FROM {s}.inbox \
                 WHERE run_id = $1 ORDER BY event_seq"),
            has_pending: f("SELECT EXISTS (SELECT 1 FROM {s}.inbox \
                 WHERE run_id = $1 AND name = $2 AND NOT delivered)"),
            list: f("SELECT run_id, info FROM {s}.runs WHERE status = $1 \
                 ORDER BY workflow, run_id"),
            children: f("SELECT run_id, info FROM {s}.runs WHERE parent = $1 ORDER BY run_id"),
            // The fact of a cancellation: the run's children that have not ended (each is
            // locked by its own follow-up cancellation, parent row first).
            live_children: f("SELECT info, run_id FROM {s}.runs WHERE parent = $1 \
                 AND status IN ('running', 'waiting', 'blocked') ORDER BY run_id"),
            // The fact of a prune: every child of the runs it names (a family with a child
            // outside the write stays whole).
            children_of_runs: f("SELECT parent, run_id FROM {s}.runs WHERE parent = ANY($1)"),
            list_workflow: f("SELECT run_id, info FROM {s}.runs \
                 WHERE status = $1 AND workflow = $2 ORDER BY run_id"),
            // Served by the index `runs_claim` (workflow, schema, run_id).
            list_of_schemas: f("SELECT run_id, info FROM {s}.runs \
                 WHERE workflow = $2 AND schema = ANY($3) AND status = $1 ORDER BY run_id"),
            // Served by the index `runs_status` (status, workflow, run_id).
            count_runs: f("SELECT workflow, status, count(*) FROM {s}.runs \
                 GROUP BY workflow, status"),
            schema: f("SELECT description FROM {s}.schemas WHERE hash = $1"),
            schemas: f("SELECT hash, description FROM {s}.schemas ORDER BY hash"),
            sealing_keys: f("SELECT key_id FROM {s}.sealing_keys ORDER BY at_ms, key_id"),
            // A key recorded already keeps its time and its first check value.
            insert_sealing_key: f(
                "INSERT INTO {s}.sealing_keys (key_id, at_ms, key_check) VALUES ($1, $2, $3) \
                 ON CONFLICT (key_id) DO UPDATE \
                 SET key_check = coalesce({s}.sealing_keys.key_check, EXCLUDED.key_check)",
            ),
            sealing_checks: f("SELECT key_id, key_check FROM {s}.sealing_keys \
                 WHERE key_check IS NOT NULL ORDER BY key_id"),
            lock_schedule: f("SELECT info FROM {s}.schedules WHERE name = $1 FOR UPDATE"),
            // A registration that finds the row taken when it inserts (another worker
            // registered the same schedule since this one read it) keeps the stored one.
            insert_schedule: f("INSERT INTO {s}.schedules (name, info) VALUES ($1, $2) \
                 ON CONFLICT (name) DO NOTHING"),
            update_schedule: f("UPDATE {s}.schedules SET info = $2 WHERE name = $1"),
            delete_schedule: f("DELETE FROM {s}.schedules WHERE name = $1"),
            schedules: f("SELECT name, info FROM {s}.schedules ORDER BY name"),
            // A lease is granted if the run has none, if its lease lapsed, or if this store
            // holds it already (the runtime claims a run once per process; a lease of this
            // store that is still live belongs to a driver that stopped and whose release
            // has not landed yet).
            acquire: f(
                "INSERT INTO {s}.leases AS l (run_id, token, owner, expires_ms) \
                 VALUES ($1, nextval('{s}.lease_tokens'), $2, {now} + $3) \
                 ON CONFLICT (run_id) DO UPDATE SET token = EXCLUDED.token, \
                   owner = EXCLUDED.owner, expires_ms = EXCLUDED.expires_ms \
                 WHERE l.expires_ms <= {now} OR l.owner = EXCLUDED.owner \
                 RETURNING token, expires_ms",
            ),
            // A run let go while it still needs a driver (its worker stops, or its driver
            // failed) wakes the other workers (docs/postgres.md, "Wake-ups"); so does a run
            // let go that waits for an event. A send of that event committing meanwhile
            // notified already, but the claims it woke may have found this lease still held,
            // and this statement's snapshot may not show the event: the later of the two
            // commits must notify, and only the send knows it is one of them.
            release: f("WITH gone AS ( \
                   DELETE FROM {s}.leases WHERE run_id = $1 AND token = $2 RETURNING run_id) \
                 SELECT pg_notify('{channel}', '') FROM gone \
                 JOIN {s}.runs r ON r.run_id = gone.run_id \
                 WHERE r.status IN ('running', 'waiting') \
                 AND (r.wait_event IS NOT NULL OR {ready})"),
            // In the transaction of a write that makes a run ready (`Effects::wakes`): sent
            // to the listeners when it commits, never if it rolls back.
            notify: f("SELECT pg_notify('{channel}', '')"),
            listen: f("LISTEN \"{channel}\""),
            renew: f("UPDATE {s}.leases AS l SET expires_ms = {now} + $3 \
                 FROM unnest($1::text[], $2::bigint[]) AS h(run_id, token) \
                 WHERE l.run_id = h.run_id AND l.token = h.token AND l.expires_ms > {now} \
                 RETURNING l.run_id, l.token, l.expires_ms"),
            // Runs that need a driver and that no live lease holds, locked with SKIP LOCKED
            // so that workers claiming at once take different runs and never wait for each
            // other; then a lease for each, unless a lease was granted meanwhile. Whether a
            // run needs a driver is its row's `RunInfo::readiness` ([`READY`]); the status
            // filter keeps the query on an index (`runs_status`, or `runs_claim`, which has
            // the schema).
            // Only runs of the schemas the worker can route are taken: `$5` and `$6` are
            // pairs (workflow, schema hash), a null hash meaning every schema of the
            // workflow; and, if `$7`, the runs of those workflows whose schema no live worker
            // routes (no unexpired row in `workers`), which the worker blocks.
            claim_ready: f("WITH ready AS ( \
                   SELECT r.run_id FROM {s}.runs r \
                   WHERE r.workflow = ANY($1) \
                   AND r.status IN ('running', 'waiting') \
                   AND (EXISTS (SELECT 1 FROM unnest($5::text[], $6::text[]) AS c(workflow, schema) \
                       WHERE c.workflow = r.workflow AND (c.schema IS NULL OR c.schema = r.schema)) \
                     OR ($7 AND NOT EXISTS (SELECT 1 FROM {s}.workers w \
                       WHERE w.workflow = r.workflow AND (w.schema = '' OR w.schema = r.schema) \
                       AND w.expires_ms > {now}))) \
                   AND {ready} \
                   AND NOT EXISTS (SELECT 1 FROM {s}.leases l \
                     WHERE l.run_id = r.run_id AND l.expires_ms > {now}) \
                   ORDER BY r.workflow, r.run_id \
                   LIMIT $2 \
                   FOR UPDATE OF r SKIP LOCKED), \
                 granted AS ( \
                   INSERT INTO {s}.leases AS l (run_id, token, owner, expires_ms) \
                   SELECT run_id, nextval('{s}.lease_tokens'), $3, {now} + $4 FROM ready \
                   ON CONFLICT (run_id) DO UPDATE SET token = EXCLUDED.token, \
                     owner = EXCLUDED.owner, expires_ms = EXCLUDED.expires_ms \
                   WHERE l.expires_ms <= {now} \
                   RETURNING l.run_id, l.token, l.expires_ms) \
                 SELECT g.run_id, g.token, g.expires_ms, r.info \
                 FROM granted g JOIN {s}.runs r ON r.run_id = g.run_id \
                 ORDER BY r.workflow, r.run_id"),
            // A worker's sign of life: $1 owner, $2 lease time in ms, $3/$4 the
            // (workflow, schema hash) pairs it routes ('' for every schema of the workflow).
            // Rows of other workers that expired go.
            announce: f("WITH gone AS ( \
                   DELETE FROM {s}.workers WHERE expires_ms <= {now} AND owner <> $1) \
                 INSERT INTO {s}.workers AS w (owner, workflow, schema, expires_ms) \
                 SELECT DISTINCT $1::text, c.workflow, coalesce(c.schema, ''), {now} + $2::bigint \
                 FROM unnest($3::text[], $4::text[]) AS c(workflow, schema) \
                 ON CONFLICT (workflow, schema, owner) \
                 DO UPDATE SET expires_ms = EXCLUDED.expires_ms"),
            // Named limits (limits.rs): the taker's declaration is kept by the first taker,
            // the row is each take's lock, and the time of a take is the server's.
            limit_declare: f(
                "INSERT INTO {s}.limits (name, concurrent, rate_n, rate_period_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING",
            ),
            limit_lock: f(
                "SELECT concurrent, rate_n, rate_period_ms, {now} FROM {s}.limits \
                 WHERE name = $1 FOR UPDATE",
            ),
            limit_redeclare: f("UPDATE {s}.limits SET concurrent = $2, rate_n = $3, \
                 rate_period_ms = $4 WHERE name = $1"),
            limit_lease_live: f("SELECT expires_ms > $3 FROM {s}.leases \
                 WHERE run_id = $1 AND token = $2"),
            // A place counts while its lease is the run's and live: the others are gone.
            limit_drop_lapsed: f("DELETE FROM {s}.limit_permits p WHERE p.name = $1 \
                 AND NOT EXISTS (SELECT 1 FROM {s}.leases l WHERE l.run_id = p.run_id \
                   AND l.token = p.token AND l.expires_ms > $2)"),
            limit_holding: f("SELECT count(*) FROM {s}.limit_permits WHERE name = $1"),
            // Starts at or before `now - period` no longer count (`Limit::counts`).
            limit_drop_starts: f("DELETE FROM {s}.limit_starts WHERE name = $1 AND at_ms <= $2"),
            limit_starts: f("SELECT at_ms FROM {s}.limit_starts WHERE name = $1"),
            limit_insert_permit: f(
                "INSERT INTO {s}.limit_permits (name, run_id, token, taken_ms) \
                 VALUES ($1, $2, $3, $4) RETURNING id",
            ),
            limit_insert_start: f("INSERT INTO {s}.limit_starts (name, at_ms) VALUES ($1, $2)"),
            limit_release: f("DELETE FROM {s}.limit_permits WHERE id = $1 AND name = $2"),
        }
    }
}
