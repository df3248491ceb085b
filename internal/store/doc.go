// Package store owns klbr's one SQLite file, <data>/runtime.sqlite: the pragmas,
// the runtime version guard, the embedded migrations, the single-owner lock, the
// one writer path with group commit, and the read queries. Nothing else in klbr
// opens the database.
//
// Writes go through Store.Write: every write function submitted by concurrent
// callers is queued to one writer goroutine, which applies a batch of them inside
// one transaction (each under its own savepoint, so one failing write does not
// sink the others) and commits once. A caller is answered only after that commit
// returned, so an acknowledgement always means the row is durable; with
// synchronous=FULL the batch shares one fsync. Reads use a separate pool of
// query-only connections and, under WAL, never block the writer.
package store
