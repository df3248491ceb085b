package sample

import "fmt"

// Größe is a size.
const Größe = 3

var registry = map[string]int{}

type Greeter struct {
	Name string
}

type Speaker interface {
	Speak() string
}

type ID = string

func New(name string) *Greeter {
	return &Greeter{Name: name}
}

func (g *Greeter) Speak() string {
	return fmt.Sprintf("héllo %s", g.Name)
}
