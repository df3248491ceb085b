import React from "react";

export function Hello({ name }: { name: string }) {
  return <div className="hi">héllo {name}</div>;
}

export const Button = (p: { label: string }) => <button>{p.label}</button>;

class Panel extends React.Component {
  render() { return <Hello name="x" />; }
}
