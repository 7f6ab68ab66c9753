// kstatus reads Kubernetes objects as JSON on stdin (one object, a List, or several objects one
// after another) and prints, per object, what sigs.k8s.io/cli-utils' kstatus computes for it:
// the library Flux, kpt and `kubectl wait`-style tooling use to decide whether a resource is
// InProgress, Current, Failed, Terminating or NotFound. One JSON line per object:
//
//	{"kind":"VigilJob","name":"hello","status":"Current","message":"Resource is current"}
//
// Built by testbed/build.sh (build_kstatus); tests/e2e/test_kstatus.py pipes live objects to it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type reading struct {
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
	Status     string `json:"status"`
	Message    string `json:"message"`
	Error      string `json:"error,omitempty"`
}

func compute(obj map[string]interface{}, out *json.Encoder) error {
	u := &unstructured.Unstructured{Object: obj}
	if u.IsList() {
		return u.EachListItem(func(item runtime.Object) error {
			return compute(item.(*unstructured.Unstructured).Object, out)
		})
	}
	r := reading{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(), Generation: u.GetGeneration()}
	result, err := status.Compute(u)
	if err != nil {
		r.Error = err.Error()
	} else {
		r.Status, r.Message = result.Status.String(), result.Message
	}
	return out.Encode(r)
}

func main() {
	dec := json.NewDecoder(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "kstatus: reading JSON from stdin:", err)
			os.Exit(2)
		}
		// as the API machinery decodes: whole numbers as int64, which kstatus' accessors expect
		var obj map[string]interface{}
		if err := utiljson.Unmarshal(raw, &obj); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus: decoding an object:", err)
			os.Exit(2)
		}
		if err := compute(obj, out); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus:", err)
			os.Exit(1)
		}
	}
}
