// Package deploy checks fdb-etcd's packaging without a Docker engine or a
// Kubernetes cluster: the Dockerfile's stages, user, ports, healthcheck and
// entrypoint; every manifest under deploy/ (apiVersion, kind and the fields
// each kind requires, cross-references between them, kustomizations); the
// compose stack; and that every command line they give fdb-etcd is accepted
// by the real binary's flag parser.
//
// Validating the built-in kinds against a real kube-apiserver with a
// server-side dry-run is left to the conformance harness; the custom
// resources (FoundationDBCluster, Certificate, Issuer, ServiceMonitor) are
// only parsed and checked here, and the tests say so.
package deploy
