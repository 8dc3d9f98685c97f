package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// Gauges computed at scrape time from the store and the watch hub.
var (
	descHasLeader = prometheus.NewDesc("etcd_server_has_leader",
		"Whether or not a leader exists. 1 is existence, 0 is not. fdb-etcd: 1 while the store answers reads.", nil, nil)
	descCurrentRev = prometheus.NewDesc("etcd_debugging_mvcc_current_revision",
		"The current revision of store.", nil, nil)
	descCompactRev = prometheus.NewDesc("etcd_debugging_mvcc_compact_revision",
		"The revision of the last compaction in store.", nil, nil)
	descRev = prometheus.NewDesc("fdb_etcd_revision",
		"The store's current revision (the newest committed revision).", nil, nil)
	descCompacted = prometheus.NewDesc("fdb_etcd_compacted_revision",
		"The store's compacted revision: revisions below it are no longer readable.", nil, nil)
	descDBSize = prometheus.NewDesc("etcd_mvcc_db_total_size_in_bytes",
		"Total size of the underlying database physically allocated in bytes.", nil, nil)
	descDBSizeInUse = prometheus.NewDesc("etcd_mvcc_db_total_size_in_use_in_bytes",
		"Total size of the underlying database logically in use in bytes.", nil, nil)
	descDBSizeDebug = prometheus.NewDesc("etcd_debugging_mvcc_db_total_size_in_bytes",
		"Total size of the underlying database physically allocated in bytes.", nil, nil)
	descWatchers = prometheus.NewDesc("etcd_debugging_mvcc_watcher_total",
		"Total number of watchers.", nil, nil)
	descSlowWatchers = prometheus.NewDesc("etcd_debugging_mvcc_slow_watcher_total",
		"Total number of unsynced slow watchers.", nil, nil)
	descStreams = prometheus.NewDesc("etcd_debugging_mvcc_watch_stream_total",
		"Total number of watch streams.", nil, nil)
	descWatchersByState = prometheus.NewDesc("fdb_etcd_watchers",
		"Watchers by state: synced (at the tail of the revision log), unsynced (catching up from history), victim (slow consumer).",
		[]string{"state"}, nil)
	descHubLag = prometheus.NewDesc("fdb_etcd_watch_hub_lag_revisions",
		"Committed revision minus the revision the watch hub has dispatched to its synced watchers.", nil, nil)
	descHubCommitted = prometheus.NewDesc("fdb_etcd_watch_hub_committed_revision",
		"The newest committed revision the watch hub knows of; 0 while no watch stream is open (the hub runs only while one is).", nil, nil)
	descHubDispatched = prometheus.NewDesc("fdb_etcd_watch_hub_dispatched_revision",
		"The newest revision the watch hub has dispatched to every synced watcher; 0 while no watch stream is open.", nil, nil)
	descWatchQueued = prometheus.NewDesc("fdb_etcd_watch_queued_bytes",
		"Approximate event bytes queued on the Watch streams, waiting for their clients to read them.", nil, nil)
	descProgressAnswers = prometheus.NewDesc("fdb_etcd_watch_progress_answers_total",
		"Watch progress requests answered: from memory at once (memory), after a read of the store's head (read), and second notifications at a newer head after an answer from memory (followup).",
		[]string{"how"}, nil)
	descHubReads = prometheus.NewDesc("fdb_etcd_watch_hub_reads_total",
		"The watch hub's reads of new revisions: answered from the log's tail in memory (this replica's own commits, or the write owner's from its commit feed), or from storage.",
		[]string{"from"}, nil)
	descCommitFeed = prometheus.NewDesc("fdb_etcd_commit_feed_revision",
		"Newest revision the write owner's commit feed reported to this replica (0 until it reports one).", nil, nil)
	descScrapeErrors = prometheus.NewDesc("fdb_etcd_scrape_store_error",
		"1 when this scrape could not read the store's state.", nil, nil)
)

type scrapeCollector struct{ m *Metrics }

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHasLeader, descCurrentRev, descCompactRev, descRev, descCompacted,
		descDBSize, descDBSizeInUse, descDBSizeDebug, descWatchers, descSlowWatchers, descStreams,
		descWatchersByState, descHubLag, descHubCommitted, descHubDispatched, descWatchQueued, descProgressAnswers, descHubReads, descCommitFeed, descScrapeErrors} {
		ch <- d
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	store, sizer, watchFn, commitFeedFn := m.store, m.sizer, m.watchFn, m.commitFeedFn
	m.mu.Unlock()

	if store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), m.opt.ScrapeTimeout)
		rev, compacted, err := store.Rev(ctx)
		cancel()
		// The store starts at compaction revision -1 as etcd does; etcd's
		// gauge reads 0 until the first compaction.
		compacted = max(compacted, 0)
		if err != nil {
			gauge(ch, descHasLeader, 0)
			gauge(ch, descScrapeErrors, 1)
		} else {
			gauge(ch, descHasLeader, 1)
			gauge(ch, descScrapeErrors, 0)
			gauge(ch, descCurrentRev, float64(rev))
			gauge(ch, descCompactRev, float64(compacted))
			gauge(ch, descRev, float64(rev))
			gauge(ch, descCompacted, float64(compacted))
		}
	}
	if sizer != nil {
		if size, err := sizer.Size(); err == nil {
			gauge(ch, descDBSize, float64(size))
			gauge(ch, descDBSizeInUse, float64(size))
			gauge(ch, descDBSizeDebug, float64(size))
		}
	}
	if watchFn != nil {
		w := watchFn()
		gauge(ch, descWatchers, float64(w.Synced+w.Unsynced+w.Lagging))
		gauge(ch, descSlowWatchers, float64(w.Unsynced+w.Lagging))
		gauge(ch, descStreams, float64(w.Streams))
		gauge(ch, descWatchersByState, float64(w.Synced), "synced")
		gauge(ch, descWatchersByState, float64(w.Unsynced), "unsynced")
		gauge(ch, descWatchersByState, float64(w.Lagging), "victim")
		gauge(ch, descHubCommitted, float64(w.CommittedRev))
		gauge(ch, descHubDispatched, float64(w.DispatchedRev))
		gauge(ch, descHubLag, float64(max(w.CommittedRev-w.DispatchedRev, 0)))
		gauge(ch, descWatchQueued, float64(w.QueuedBytes))
		counter(ch, descProgressAnswers, float64(w.ProgressFromMemory), "memory")
		counter(ch, descProgressAnswers, float64(w.ProgressAfterRead), "read")
		counter(ch, descProgressAnswers, float64(w.ProgressFollowUps), "followup")
		counter(ch, descHubReads, float64(w.ReadsFromMemory), "memory")
		counter(ch, descHubReads, float64(w.ReadsFromStorage), "storage")
	}
	if commitFeedFn != nil {
		gauge(ch, descCommitFeed, float64(commitFeedFn()))
	}
}
