// Package charttest holds the tests of pathmend's Helm chart
// (deploy/helm/pathmend), run by `make test` and `make verify`.
//
// It is a module of its own so that the Helm SDK (helm.sh/helm/v4) and
// kustomize never enter pathmend's go.mod: the tests render the chart the
// way `helm template` does and the kustomizations the way `kubectl apply
// -k` does, and compare the objects; they lint the chart with Helm's
// linter, and check the values against the flags of the pathmend binary
// built from the same checkout.
package charttest
