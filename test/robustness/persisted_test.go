package robustness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"go.etcd.io/etcd/tests/v3/robustness/model"
)

// persistedRequest is one line of `fdb-etcd experimental-export-persisted`
// (mvcc.PersistedRequest; this module does not import fdb-etcd).
type persistedRequest struct {
	Type     string `json:"type"`
	Revision int64  `json:"revision"`
	LeaseID  int64  `json:"leaseID"`
	Compact  int64  `json:"compact"`
	Ops      []struct {
		Delete bool   `json:"delete"`
		Key    []byte `json:"key"`
		Value  []byte `json:"value"`
		Lease  int64  `json:"lease"`
	} `json:"ops"`
}

// toModelRequests converts the export into the persisted requests etcd's
// validators take (what etcd's report package reads from its WAL), and
// replays them through etcd's model: every revision the server logged must be
// the revision the model assigns.
func toModelRequests(export []byte) ([]model.EtcdRequest, error) {
	var out []model.EtcdRequest
	var revs []int64
	sc := bufio.NewScanner(bytes.NewReader(export))
	sc.Buffer(make([]byte, 64<<20), 64<<20)
	for sc.Scan() {
		var p persistedRequest
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return nil, err
		}
		var r model.EtcdRequest
		switch p.Type {
		case "txn":
			txn := &model.TxnRequest{Conditions: []model.EtcdCondition{}, OperationsOnFailure: []model.EtcdOperation{}}
			for _, op := range p.Ops {
				if op.Delete {
					txn.OperationsOnSuccess = append(txn.OperationsOnSuccess, model.EtcdOperation{
						Type: model.DeleteOperation, Delete: model.DeleteOptions{Key: string(op.Key)}})
					continue
				}
				txn.OperationsOnSuccess = append(txn.OperationsOnSuccess, model.EtcdOperation{
					Type: model.PutOperation,
					Put:  model.PutOptions{Key: string(op.Key), Value: model.ToValueOrHash(string(op.Value)), LeaseID: op.Lease}})
			}
			r = model.EtcdRequest{Type: model.Txn, Txn: txn}
		case "leaseGrant":
			r = model.EtcdRequest{Type: model.LeaseGrant, LeaseGrant: &model.LeaseGrantRequest{LeaseID: p.LeaseID}}
		case "leaseRevoke":
			r = model.EtcdRequest{Type: model.LeaseRevoke, LeaseRevoke: &model.LeaseRevokeRequest{LeaseID: p.LeaseID}}
		case "compact":
			r = model.EtcdRequest{Type: model.Compact, Compact: &model.CompactRequest{Revision: p.Compact}}
		default:
			return nil, fmt.Errorf("unknown persisted request type %q", p.Type)
		}
		out = append(out, r)
		revs = append(revs, p.Revision)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// Replay: the model must reproduce each logged revision.
	var keys []string
	seen := map[string]bool{}
	for _, r := range out {
		if r.Type == model.Txn {
			for _, op := range r.Txn.OperationsOnSuccess {
				if k := op.Put.Key + op.Delete.Key; !seen[k] {
					seen[k] = true
					keys = append(keys, k)
				}
			}
		}
	}
	sort.Strings(keys)
	state := model.DeterministicModel(keys).Init().(model.EtcdState)
	for i, r := range out {
		next, resp := state.Step(r)
		if resp.Error != "" || resp.ClientError != "" {
			return nil, fmt.Errorf("persisted request %d (%s) fails in etcd's model: %s%s", i, r.Type, resp.Error, resp.ClientError)
		}
		if revs[i] != 0 && next.Revision != revs[i] {
			return nil, fmt.Errorf("persisted request %d (%s) logged at revision %d, etcd's model puts it at %d", i, r.Type, revs[i], next.Revision)
		}
		if revs[i] == 0 && r.Type == model.Txn {
			return nil, fmt.Errorf("persisted txn %d without a revision", i)
		}
		state = next
	}
	return out, nil
}
