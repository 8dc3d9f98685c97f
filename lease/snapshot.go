package lease

// SnapshotTTL decodes a stored lease record for a snapshot: its granted TTL
// and the whole seconds left before its durable deadline by the lessor's
// clock (negative when overdue). It reads nothing and works after Stop.
func (l *Lessor) SnapshotTTL(rec []byte) (ttl, remaining int64, err error) {
	r, err := decodeRecord(rec)
	if err != nil {
		return 0, 0, err
	}
	return r.TTL, (r.Deadline - l.clock.Now().UnixMicro()) / 1e6, nil
}
