// Command nullwebhook is the floor of an admission webhook: it allows every AdmissionReview
// at once, over TLS, so the benchmark suite can tell the API server's own cost of calling a
// webhook from the cost of the operator's webhook (P3 in docs/benchmarks.md).
//
//	nullwebhook --address 127.0.0.1:9444 --cert tls.crt --key tls.key
//
// Every path answers a review; GET /count answers how many reviews were allowed so far, so
// the suite can check that the API server called it for every create it timed. Only the
// standard library is used.
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request,omitempty"`
}

type response struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

type answer struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Response   response `json:"response"`
}

func main() {
	address := flag.String("address", "127.0.0.1:9444", "host:port to serve HTTPS on")
	certFile := flag.String("cert", "", "PEM serving certificate")
	keyFile := flag.String("key", "", "PEM private key of the certificate")
	flag.Parse()
	if *certFile == "" || *keyFile == "" {
		fmt.Fprintln(os.Stderr, "nullwebhook: --cert and --key are required")
		os.Exit(2)
	}
	pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("nullwebhook: loading the key pair: %v", err)
	}
	var allowed atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(strconv.FormatInt(allowed.Load(), 10) + "\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		var in review
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Request == nil {
			http.Error(w, "body: want an AdmissionReview with a request", http.StatusBadRequest)
			return
		}
		out := answer{
			APIVersion: "admission.k8s.io/v1",
			Kind:       "AdmissionReview",
			Response:   response{UID: in.Request.UID, Allowed: true},
		}
		body, err := json.Marshal(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		allowed.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
	server := &http.Server{
		Addr:              *address,
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
	}
	fmt.Printf("nullwebhook: serving on https://%s\n", *address)
	if err := server.ListenAndServeTLS("", ""); err != nil {
		log.Fatalf("nullwebhook: %v", err)
	}
}
