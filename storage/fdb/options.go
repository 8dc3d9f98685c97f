package fdb

// ClientBuggify configures FoundationDB's client-side fault injection (the
// client_buggify_* network options): with it the client library fails
// requests at random with retryable errors, reports commits as
// commit_unknown_result, and delays them, exercising every retry path of
// the layers above against a healthy cluster. A testing aid, never for
// production. (Declared without the fdb build tag so that flags can be
// parsed into it in any build.)
type ClientBuggify struct {
	Enable bool
	// SectionActivatedPercent is the probability (0-100) that a buggify
	// section of the client is active for this process; 0 keeps
	// FoundationDB's default.
	SectionActivatedPercent int
	// SectionFiredPercent is the probability (0-100) that an active
	// section fires each time it is reached; 0 keeps FoundationDB's default.
	SectionFiredPercent int
}
