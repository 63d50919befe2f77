// Package store is the ack monitor's ledger: the message_acknowledgments
// and acknowledgment_metrics tables, plus the monitor's alerts
// and agent health, behind one small interface with two implementations:
// SQLite ([OpenSQLite], pure Go, the default) and PostgreSQL
// ([OpenPostgres]). Both share one SQL schema, versioned migrations and one
// conformance suite (package storetest).
//
// # Keys and idempotency
//
// A ledger row is one delivery target of one stored message: the key is
// (stream_seq, consumer). The stream sequence identifies the message in
// the MESH stream for ever (a message_id repeats once the duplicate window
// has passed), and the consumer names the receiver and priority — for
// topic and broadcast messages the consumer is the only place the receiver
// appears, so one stream message becomes one row per receiving consumer.
//
// Every row keeps the history of the consumer events applied to it, each
// with the event's unique id. [Store.Apply] appends only events whose id is
// not yet in the history and recomputes the row from the history, so events
// may arrive in any order (an ack metric before the send, a NAK after the
// ACK) and replays after a monitor restart change nothing.
//
// # Concurrent writers
//
// Several transactions write at once: the monitor's intakes of events,
// core NATS events and sends, and an instance still committing a batch
// after another took over. SQLite has one writer at a time. PostgreSQL
// reads rows FOR UPDATE, which cannot lock a row not created yet, so
// [Store.Apply] first takes a transaction-scoped advisory lock per stream
// sequence its events and sends touch, in sorted order; without it,
// two transactions creating a row would each write only their own events
// and the later commit would drop the other's.
//
// # Text
//
// Header values and TERM reasons come from any publisher. [Store.Apply]
// stores NUL bytes and invalid UTF-8 in them as U+FFFD in both dialects:
// PostgreSQL's TEXT refuses them, and a batch it refuses comes back on
// every redelivery.
//
// # Time
//
// Every *_at column and hour_bucket is a BIGINT of Unix microseconds (UTC)
// in both dialects, so the SQL is shared and ordering is exact.
package store
