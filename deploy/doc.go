// Package deploy holds pathmend's Kubernetes manifests: the kustomize base
// (namespace, service account, CSIDriver, node DaemonSet), the overlays
// that choose the heal mode (observe, repair), the examples (static
// PersistentVolumes with their node-stage Secrets, a StorageClass, a claim
// and a pod, a PodMonitor and a PrometheusRule) and VERSION, the release
// whose image the manifests run (Version).
//
// Its only Go API is Version. Its tests decode every manifest strictly into its
// Kubernetes API type (an unknown or misspelt field fails), render each
// kustomization the way kustomize does, and check what keeps the pieces
// consistent with each other and with the pathmend binary: the socket
// kubelet registers is the one pathmend serves, every flag exists, every
// probe reaches a port something listens on, the image is the VERSION
// release, and every example volume passes the volume-context parser.
package deploy
