// Command etcd is the etcd server for gputally's Kubernetes test harness: a tiny
// main around etcd's own entry point, built from the go.etcd.io/etcd/server/v3
// version pinned in ../../go.mod (the one k8s.io/kubernetes itself requires).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
