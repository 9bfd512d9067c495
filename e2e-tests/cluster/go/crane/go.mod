// crane, from go-containerregistry: the node's images (pause, the app's
// busybox, serve's) are assembled from files and pushed to the local
// registry with it, with no container engine.
module config-snapshot.dev/e2e/crane

go 1.25.0

require github.com/google/go-containerregistry v0.22.1
