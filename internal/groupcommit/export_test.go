package groupcommit

// Queued is how many requests wait for a batch.
func (q *Queue[Req, Resp]) Queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}
